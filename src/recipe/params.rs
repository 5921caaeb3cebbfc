//! Binding parameter values to a recipe's declared parameters.
//!
//! Values come from `--params FILE` (YAML or JSON) and `--param KEY=VALUE` (later wins). Each
//! declared parameter gets the given value, else its default; values are checked against
//! `input_type`, and a `file` parameter is replaced by the file's contents. Templates see
//! every value as a string, as goose passes them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use indexmap::IndexMap;

use super::{InputType, Parameter, Requirement};
use crate::diag::{Diagnostic, Diagnostics, SourceFile, Span};
use crate::yaml;

/// Where a given value came from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Origin {
    Flag,
    File(PathBuf),
}

/// Parameter values given on the command line, before binding.
#[derive(Debug, Clone, Default)]
pub(crate) struct ParamInput {
    pub(crate) values: IndexMap<String, (String, Origin)>,
}

impl ParamInput {
    pub(crate) fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Reads `--params FILE` then applies `--param KEY=VALUE` flags over it.
    pub(crate) fn from_args(
        params_file: Option<&Path>,
        flags: &[String],
        cwd: &Path,
    ) -> Result<Self, Diagnostic> {
        let mut input = Self::default();
        if let Some(path) = params_file {
            let path = cwd.join(path);
            for (key, value) in read_params_file(&path)? {
                input
                    .values
                    .insert(key, (value, Origin::File(path.clone())));
            }
        }
        for flag in flags {
            let Some((key, value)) = flag.split_once('=') else {
                return Err(Diagnostic::error(format!(
                    "invalid --param `{flag}`: expected KEY=VALUE"
                )));
            };
            let key = key.trim();
            if key.is_empty() {
                return Err(Diagnostic::error(format!(
                    "invalid --param `{flag}`: the key is empty"
                )));
            }
            input
                .values
                .insert(key.to_owned(), (value.to_owned(), Origin::Flag));
        }
        Ok(input)
    }
}

/// A YAML or JSON mapping of parameter values; scalars become strings.
fn read_params_file(path: &Path) -> Result<IndexMap<String, String>, Diagnostic> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Diagnostic::error(format!("cannot read parameters file: {e}")).in_file(path)
    })?;
    let file = SourceFile::new(path, text);
    let root = match yaml::parse(&file.text) {
        Ok(Some(root)) => root,
        Ok(None) => return Ok(IndexMap::new()),
        Err(e) => {
            return Err(Diagnostic::error(format!("invalid YAML: {}", e.message))
                .at(Span::new(&file, e.pos)));
        }
    };
    let Some(entries) = root.as_map() else {
        return Err(Diagnostic::error(format!(
            "a parameters file must be a mapping of names to values, found {}",
            root.kind_name()
        ))
        .at(Span::new(&file, root.pos)));
    };
    let mut out = IndexMap::new();
    for (key, value) in entries {
        let Some(name) = key.as_str() else {
            return Err(
                Diagnostic::error("parameter names must be strings").at(Span::new(&file, key.pos))
            );
        };
        let text = match value.to_json() {
            serde_json::Value::String(s) => s,
            serde_json::Value::Null => String::new(),
            scalar @ (serde_json::Value::Bool(_) | serde_json::Value::Number(_)) => {
                scalar.to_string()
            }
            _ => {
                return Err(Diagnostic::error(format!(
                    "parameter `{name}` must be a single value, found {}",
                    value.kind_name()
                ))
                .at(Span::new(&file, value.pos)));
            }
        };
        out.insert(name.to_owned(), text);
    }
    Ok(out)
}

/// Where a bound value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ValueSource {
    Given(Origin),
    Default,
    /// Optional, without a default: bound to the empty string.
    Empty,
    /// Required and not given: binding fails.
    Missing,
}

/// One declared parameter and the value it gets.
#[derive(Debug, Clone)]
pub(crate) struct BoundEntry {
    pub(crate) key: String,
    pub(crate) value: Option<String>,
    pub(crate) source: ValueSource,
}

/// The outcome of binding: every parameter's value, and every problem found.
#[derive(Debug, Default)]
pub(crate) struct Binding {
    pub(crate) entries: Vec<BoundEntry>,
    pub(crate) problems: Diagnostics,
}

impl Binding {
    /// Values for templates; only meaningful when there are no problems.
    pub(crate) fn values(&self) -> IndexMap<String, String> {
        self.entries
            .iter()
            .filter_map(|e| Some((e.key.clone(), e.value.clone()?)))
            .collect()
    }
}

/// Binds `input` to `parameters`. `preset` holds values fixed by the caller (a sub-recipe's
/// `values`): they win over the input, as in goose, and a different value given for one is
/// a warning. Missing required parameters are
/// reported in one error that shows the flags to add.
pub(crate) fn bind_params(
    parameters: &[Parameter],
    input: &ParamInput,
    preset: &IndexMap<String, String>,
    source_file: Option<&Arc<SourceFile>>,
    cwd: &Path,
) -> Binding {
    let mut binding = Binding::default();
    for key in input.values.keys() {
        if !parameters.iter().any(|p| &p.key == key) {
            let mut message = format!("unknown parameter `{key}`");
            if parameters.is_empty() {
                message.push_str(": this source declares no parameters");
            }
            let mut diagnostic = Diagnostic::error(message);
            if !parameters.is_empty() {
                let names: Vec<_> = parameters.iter().map(|p| p.key.as_str()).collect();
                diagnostic =
                    diagnostic.with_hint(format!("declared parameters: {}", names.join(", ")));
            }
            binding.problems.push(diagnostic);
        }
    }
    let mut missing = Vec::new();
    for parameter in parameters {
        // A subrecipe's fixed `values` win over what is given, as in goose; what is given
        // for such a key is said to be ignored.
        let fixed = preset.get(&parameter.key);
        if let (Some(fixed), Some((given, _))) = (fixed, input.values.get(&parameter.key))
            && fixed != given
        {
            binding.problems.push(Diagnostic::warning(format!(
                "parameter `{}` is fixed to `{fixed}` by the subrecipe's `values`; the value given, `{given}`, is ignored",
                parameter.key
            )));
        }
        let given = fixed
            .map(|v| (v.clone(), ValueSource::Given(Origin::Flag)))
            .or_else(|| {
                input
                    .values
                    .get(&parameter.key)
                    .map(|(v, origin)| (v.clone(), ValueSource::Given(origin.clone())))
            });
        let (raw, source) = match given {
            Some(given) => given,
            None => match (&parameter.default, parameter.requirement) {
                (Some(default), _) => (default.clone(), ValueSource::Default),
                (None, Requirement::Optional) => (String::new(), ValueSource::Empty),
                (None, _) => {
                    missing.push(parameter);
                    binding.entries.push(BoundEntry {
                        key: parameter.key.clone(),
                        value: None,
                        source: ValueSource::Missing,
                    });
                    continue;
                }
            },
        };
        let checked = if source == ValueSource::Empty {
            Ok(raw)
        } else {
            check_value(parameter, &raw, cwd)
        };
        match checked {
            Ok(value) => binding.entries.push(BoundEntry {
                key: parameter.key.clone(),
                value: Some(value),
                source,
            }),
            Err(message) => {
                let mut diagnostic = Diagnostic::error(message);
                if source == ValueSource::Default
                    && let Some(file) = source_file
                {
                    diagnostic = diagnostic.at(Span::new(file, parameter.pos));
                }
                binding.problems.push(diagnostic);
                binding.entries.push(BoundEntry {
                    key: parameter.key.clone(),
                    value: None,
                    source,
                });
            }
        }
    }
    if !missing.is_empty() {
        let names: Vec<String> = missing.iter().map(|p| format!("`{}`", p.key)).collect();
        let flags: Vec<String> = missing
            .iter()
            .map(|p| format!("--param {}={}", p.key, placeholder(p)))
            .collect();
        let noun = if missing.len() == 1 {
            "parameter"
        } else {
            "parameters"
        };
        binding.problems.push(
            Diagnostic::error(format!("missing required {noun}: {}", names.join(", ")))
                .with_hint(format!("add {}", flags.join(" "))),
        );
    }
    binding
}

fn placeholder(parameter: &Parameter) -> String {
    match parameter.input_type {
        InputType::Select => parameter.options.join("|"),
        InputType::Boolean => "true|false".into(),
        InputType::Number => "NUMBER".into(),
        InputType::Date => "YYYY-MM-DD".into(),
        InputType::File => "PATH".into(),
        InputType::String => "VALUE".into(),
    }
}

/// Checks a value against the parameter's type; a file parameter becomes the file's text.
pub(crate) fn check_value(parameter: &Parameter, raw: &str, cwd: &Path) -> Result<String, String> {
    let key = &parameter.key;
    match parameter.input_type {
        InputType::String => Ok(raw.to_owned()),
        InputType::Number => {
            let trimmed = raw.trim();
            match trimmed.parse::<f64>() {
                Ok(n) if n.is_finite() => Ok(trimmed.to_owned()),
                _ => Err(format!("parameter `{key}` must be a number, got `{raw}`")),
            }
        }
        InputType::Boolean => match raw.trim().to_ascii_lowercase().as_str() {
            "true" => Ok("true".into()),
            "false" => Ok("false".into()),
            _ => Err(format!(
                "parameter `{key}` must be true or false, got `{raw}`"
            )),
        },
        InputType::Select => {
            if parameter.options.iter().any(|o| o == raw) {
                Ok(raw.to_owned())
            } else {
                Err(format!(
                    "parameter `{key}` must be one of {}, got `{raw}`",
                    parameter.options.join(", ")
                ))
            }
        }
        InputType::Date => {
            let trimmed = raw.trim();
            let ok = trimmed.parse::<jiff::civil::Date>().is_ok()
                || trimmed.parse::<jiff::civil::DateTime>().is_ok()
                || trimmed.parse::<jiff::Timestamp>().is_ok();
            if ok {
                Ok(trimmed.to_owned())
            } else {
                Err(format!(
                    "parameter `{key}` must be an ISO-8601 date (YYYY-MM-DD), got `{raw}`"
                ))
            }
        }
        InputType::File => {
            let path = cwd.join(raw.trim());
            if path.is_dir() {
                // Recipes in the wild ask for "the file or folder": a folder stays a path.
                return Ok(raw.trim().to_owned());
            }
            std::fs::read_to_string(&path).map_err(|e| {
                format!(
                    "parameter `{key}`: cannot read file `{}`: {e}",
                    path.display()
                )
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::Pos;

    fn param(key: &str, input_type: InputType, requirement: Requirement) -> Parameter {
        Parameter {
            key: key.into(),
            pos: Pos::default(),
            input_type,
            requirement,
            default: None,
            description: String::new(),
            options: vec!["a".into(), "b".into()],
        }
    }

    fn input(pairs: &[(&str, &str)]) -> ParamInput {
        let flags: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        ParamInput::from_args(None, &flags, Path::new(".")).unwrap()
    }

    fn bind(params: &[Parameter], pairs: &[(&str, &str)]) -> Binding {
        bind_params(
            params,
            &input(pairs),
            &IndexMap::new(),
            None,
            Path::new("."),
        )
    }

    #[test]
    fn types_are_checked() {
        let cases: &[(InputType, &str, Option<&str>)] = &[
            (InputType::Number, "42", Some("42")),
            (InputType::Number, "4.5", Some("4.5")),
            (InputType::Number, "many", None),
            (InputType::Boolean, "TRUE", Some("true")),
            (InputType::Boolean, "yes", None),
            (InputType::Select, "b", Some("b")),
            (InputType::Select, "c", None),
            (InputType::Date, "2026-02-19", Some("2026-02-19")),
            (
                InputType::Date,
                "2026-02-19T10:00:00",
                Some("2026-02-19T10:00:00"),
            ),
            (InputType::Date, "19/02/2026", None),
            (InputType::String, "a: b\n{{ x }}", Some("a: b\n{{ x }}")),
        ];
        for (input_type, raw, expected) in cases {
            let binding = bind(
                &[param("p", *input_type, Requirement::Required)],
                &[("p", raw)],
            );
            assert_eq!(
                binding.values().get("p").map(String::as_str),
                *expected,
                "{input_type:?} {raw:?}"
            );
            assert_eq!(binding.problems.has_errors(), expected.is_none());
        }
    }

    #[test]
    fn all_missing_required_parameters_in_one_error() {
        let params = [
            param("a", InputType::String, Requirement::Required),
            param("b", InputType::Number, Requirement::UserPrompt),
            param("c", InputType::String, Requirement::Optional),
        ];
        let binding = bind(&params, &[]);
        assert_eq!(binding.problems.items.len(), 1);
        let problem = &binding.problems.items[0];
        assert_eq!(problem.message, "missing required parameters: `a`, `b`");
        assert_eq!(
            problem.hint.as_deref(),
            Some("add --param a=VALUE --param b=NUMBER")
        );
        assert_eq!(binding.entries[2].value.as_deref(), Some(""));
    }

    #[test]
    fn unknown_keys_are_errors() {
        let binding = bind(
            &[param("a", InputType::String, Requirement::Optional)],
            &[("zz", "1")],
        );
        assert!(
            binding.problems.items[0]
                .message
                .contains("unknown parameter `zz`")
        );
    }

    #[test]
    fn file_parameters_become_contents() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("notes.txt"), "hello\n").unwrap();
        let params = [param("f", InputType::File, Requirement::Required)];
        let binding = bind_params(
            &params,
            &input(&[("f", "notes.txt")]),
            &IndexMap::new(),
            None,
            dir.path(),
        );
        assert_eq!(binding.values()["f"], "hello\n");
        let binding = bind_params(
            &params,
            &input(&[("f", "nope.txt")]),
            &IndexMap::new(),
            None,
            dir.path(),
        );
        assert!(
            binding.problems.items[0]
                .message
                .contains("cannot read file")
        );
    }

    #[test]
    fn params_file_then_flags() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p.yaml"), "a: 1\nb: two\n").unwrap();
        let input =
            ParamInput::from_args(Some(Path::new("p.yaml")), &["b=three".into()], dir.path())
                .unwrap();
        assert_eq!(input.values["a"].0, "1");
        assert_eq!(input.values["b"].0, "three");
        std::fs::write(dir.path().join("bad.yaml"), "a: [1\n").unwrap();
        let err = ParamInput::from_args(Some(Path::new("bad.yaml")), &[], dir.path()).unwrap_err();
        assert!(err.span.is_some());
    }
}
