//! `--param KEY[:TYPE][=DEFAULT]` of `summon new recipe` and `summon new pipeline`.

use crate::recipe::InputType;

/// One parameter to declare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParamSpec {
    pub(crate) key: String,
    /// The `input_type` name as written in the file.
    pub(crate) input_type: &'static str,
    /// With a default the parameter is optional.
    pub(crate) default: Option<String>,
    /// A select's options.
    pub(crate) options: Vec<String>,
}

/// Names a template context already has, which a parameter must not hide.
const TAKEN: &[&str] = &["recipe_dir", "item", "loop", "steps", "agents"];

/// Parses every `--param`; errors name the flag as given.
pub(crate) fn parse_params(specs: &[String]) -> Result<Vec<ParamSpec>, String> {
    let mut out: Vec<ParamSpec> = Vec::new();
    for spec in specs {
        let param = parse_one(spec).map_err(|why| format!("--param `{spec}`: {why}"))?;
        if out.iter().any(|p| p.key == param.key) {
            return Err(format!(
                "--param `{spec}`: parameter `{}` is given twice",
                param.key
            ));
        }
        out.push(param);
    }
    Ok(out)
}

fn parse_one(spec: &str) -> Result<ParamSpec, String> {
    let (head, value) = match spec.split_once('=') {
        Some((head, value)) => (head, Some(value)),
        None => (spec, None),
    };
    let (key, type_name) = match head.split_once(':') {
        Some((key, type_name)) => (key.trim(), type_name.trim()),
        None => (head.trim(), "string"),
    };
    if key.is_empty() {
        return Err("the key is empty; write KEY, KEY:TYPE or KEY:TYPE=DEFAULT".to_owned());
    }
    let identifier = key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !identifier {
        return Err(format!(
            "`{key}` cannot be used in a template as `{{{{ {key} }}}}`: use letters, digits and \
             `_`, not starting with a digit"
        ));
    }
    if TAKEN.contains(&key) {
        return Err(format!(
            "`{key}` is already defined in templates; choose another key"
        ));
    }
    let input_type = InputType::from_name(type_name)
        .map(|_| canonical(type_name))
        .ok_or_else(|| {
            format!(
                "unknown type `{type_name}`; the types are {}",
                InputType::NAMES
            )
        })?;
    let mut param = ParamSpec {
        key: key.to_owned(),
        input_type,
        default: None,
        options: Vec::new(),
    };
    match (input_type, value) {
        ("select", None) => {
            return Err(format!(
                "a select lists its options after `=`: `{key}:select=low,medium,high`"
            ));
        }
        ("select", Some(list)) => {
            param.options = list
                .split(',')
                .map(str::trim)
                .filter(|o| !o.is_empty())
                .map(str::to_owned)
                .collect();
            if param.options.is_empty() {
                return Err("a select needs at least one option".to_owned());
            }
        }
        ("number", Some(v)) if v.trim().parse::<f64>().is_err() => {
            return Err(format!("the default `{v}` is not a number"));
        }
        ("boolean", Some(v)) if !matches!(v.trim(), "true" | "false") => {
            return Err(format!("the default `{v}` is not `true` or `false`"));
        }
        (_, Some(v)) => param.default = Some(v.to_owned()),
        (_, None) => {}
    }
    Ok(param)
}

fn canonical(name: &str) -> &'static str {
    match name {
        "number" => "number",
        "boolean" => "boolean",
        "date" => "date",
        "file" => "file",
        "select" => "select",
        _ => "string",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(spec: &str) -> Result<ParamSpec, String> {
        parse_params(&[spec.to_owned()]).map(|mut v| v.remove(0))
    }

    #[test]
    fn forms() {
        let p = one("path").unwrap();
        assert_eq!(
            (p.key.as_str(), p.input_type, p.default),
            ("path", "string", None)
        );
        let p = one("count:number=3").unwrap();
        assert_eq!((p.input_type, p.default.as_deref()), ("number", Some("3")));
        let p = one("since:string=v1.0: first").unwrap();
        assert_eq!(p.default.as_deref(), Some("v1.0: first"));
        let p = one("level:select=low, high").unwrap();
        assert_eq!(p.options, ["low", "high"]);
        assert_eq!(p.default, None);
    }

    #[test]
    fn errors_name_the_flag_and_the_problem() {
        let cases = [
            ("", "the key is empty"),
            ("my-key", "cannot be used in a template"),
            ("1st", "cannot be used in a template"),
            ("x:text", "unknown type `text`"),
            ("x:select", "lists its options"),
            ("x:number=many", "not a number"),
            ("x:boolean=yes", "not `true` or `false`"),
            ("item", "already defined"),
        ];
        for (spec, why) in cases {
            let err = one(spec).expect_err(spec);
            assert!(err.starts_with(&format!("--param `{spec}`")), "{err}");
            assert!(err.contains(why), "{spec}: {err}");
        }
        let err = parse_params(&["a".into(), "a:number".into()]).unwrap_err();
        assert!(err.contains("given twice"), "{err}");
    }
}
