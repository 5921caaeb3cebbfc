//! Finds what a template text refers to without rendering it: `steps.<id>` references (with
//! the field read after them), uses of `steps` as a whole, and where a variable is used.
//!
//! Only the inside of tags (`{{ ... }}`, `{% ... %}`) is searched; literal text, comments
//! and `{% raw %}` blocks are prose, so "see steps.md" in an instruction is no reference.

use std::ops::Range;
use std::sync::LazyLock;

use regex::Regex;

/// `steps.<id>` or `steps['<id>']` / `steps["<id>"]`, then optionally the field read.
static STEP_REF: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"\bsteps\s*(?:\.\s*([A-Za-z_][A-Za-z0-9_]*)|\[\s*(?:'([^'\n]*)'|"([^"\n]*)")\s*\])(?:\s*(?:\.\s*([A-Za-z_][A-Za-z0-9_]*)|\[\s*['"]([A-Za-z_][A-Za-z0-9_]*)['"]\s*\]))?"#,
    )
    .expect("step reference pattern")
});

static STEPS_WORD: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\bsteps\b").expect("steps pattern"));

static RAW_END: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\{%[-+]?\s*endraw\s*[-+]?%\}").expect("endraw pattern"));

/// One `steps.<id>` reference inside a template text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StepRef {
    pub(crate) id: String,
    /// Byte offset of the id in the text.
    pub(crate) offset: usize,
    /// The field read from it (`output`, `items`, `results`), when one follows.
    pub(crate) field: Option<String>,
}

/// The byte ranges of the insides of the template tags of `text`, in order.
pub(crate) fn tag_regions(text: &str) -> Vec<Range<usize>> {
    let bytes = text.as_bytes();
    let mut regions = Vec::new();
    let mut i = 0;
    while i + 1 < bytes.len() {
        if bytes[i] != b'{' {
            i += 1;
            continue;
        }
        let close = match bytes[i + 1] {
            b'{' => "}}",
            b'%' => "%}",
            b'#' => "#}",
            _ => {
                i += 1;
                continue;
            }
        };
        let start = i + 2;
        let end = text[start..].find(close).map_or(text.len(), |e| start + e);
        let next = (end + 2).min(text.len());
        if close == "#}" {
            i = next;
            continue;
        }
        let inner =
            text[start..end].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        if close == "%}" && (inner == "raw" || inner.starts_with("raw ")) {
            i = RAW_END
                .find(&text[next..])
                .map_or(text.len(), |m| next + m.end());
            continue;
        }
        regions.push(start..end);
        i = next;
    }
    regions
}

/// Whether the byte before `start` continues a name or an attribute path (`item.steps`).
fn continues_name(text: &str, start: usize) -> bool {
    text[..start]
        .chars()
        .next_back()
        .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.')
}

/// Every `steps.<id>` reference inside the tags of `text`, in order.
pub(crate) fn step_refs(text: &str) -> Vec<StepRef> {
    let mut out = Vec::new();
    for region in tag_regions(text) {
        let inner = &text[region.clone()];
        for caps in STEP_REF.captures_iter(inner) {
            let whole = caps.get(0).expect("match");
            if continues_name(text, region.start + whole.start()) {
                continue;
            }
            let Some(id) = caps.get(1).or(caps.get(2)).or(caps.get(3)) else {
                continue;
            };
            let field = caps.get(4).or(caps.get(5)).map(|m| m.as_str().to_owned());
            out.push(StepRef {
                id: id.as_str().to_owned(),
                offset: region.start + id.start(),
                field,
            });
        }
    }
    out
}

/// Byte offsets of uses of `steps` that name no step (`{% for s in steps %}`,
/// `steps[name]`): such a template may read any step.
pub(crate) fn whole_steps_uses(text: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for region in tag_regions(text) {
        let inner = &text[region.clone()];
        let refs: Vec<Range<usize>> = STEP_REF
            .find_iter(inner)
            .map(|m| m.start()..m.end())
            .collect();
        for word in STEPS_WORD.find_iter(inner) {
            let offset = region.start + word.start();
            if continues_name(text, offset) || refs.iter().any(|r| r.start == word.start()) {
                continue;
            }
            out.push(offset);
        }
    }
    out
}

/// Byte offset of the first use of the variable `name` inside a tag of `text`: the name as a
/// whole word that is not an attribute (`x.name`) and not inside a string literal.
pub(crate) fn find_variable(text: &str, name: &str) -> Option<usize> {
    for region in tag_regions(text) {
        let inner = &text[region.clone()];
        let mut quote: Option<char> = None;
        let mut prev: Option<char> = None;
        for (i, c) in inner.char_indices() {
            match quote {
                Some(q) => {
                    if c == q && prev != Some('\\') {
                        quote = None;
                    }
                }
                None if c == '\'' || c == '"' => quote = Some(c),
                None => {
                    let is_name = |c: char| c.is_alphanumeric() || c == '_';
                    if inner[i..].starts_with(name)
                        && !prev.is_some_and(|p| is_name(p) || p == '.')
                        && !inner[i + name.len()..].chars().next().is_some_and(is_name)
                    {
                        return Some(region.start + i);
                    }
                }
            }
            prev = Some(c);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(text: &str) -> Vec<(String, usize, Option<String>)> {
        step_refs(text)
            .into_iter()
            .map(|r| (r.id, r.offset, r.field))
            .collect()
    }

    /// A reference as `(id, offset, field)`.
    type Want<'a> = (&'a str, usize, Option<&'a str>);

    #[test]
    fn references_in_every_form() {
        let cases: &[(&str, &[Want<'_>])] = &[
            ("{{ steps.a.output }}", &[("a", 9, Some("output"))]),
            ("{{ steps['b'].items }}", &[("b", 10, Some("items"))]),
            (
                "{{ steps[\"c\"][\"results\"] }}",
                &[("c", 10, Some("results"))],
            ),
            ("{{ steps.d }}", &[("d", 9, None)]),
            (
                "{% for r in steps.n.results %}{{ steps.m.output }}{% endfor %}",
                &[("n", 18, Some("results")), ("m", 39, Some("output"))],
            ),
            ("{{ steps . e . output }}", &[("e", 11, Some("output"))]),
            // prose, comments, raw blocks and attribute paths are not references
            ("see steps.md and {# steps.x #}", &[]),
            (
                "{% raw %}{{ steps.x }}{% endraw %}{{ steps.y }}",
                &[("y", 43, None)],
            ),
            ("{{ item.steps.x }} {{ mysteps.y }}", &[]),
        ];
        for (text, want) in cases {
            let want: Vec<_> = want
                .iter()
                .map(|(id, o, f)| ((*id).to_owned(), *o, f.map(str::to_owned)))
                .collect();
            assert_eq!(ids(text), want, "{text}");
        }
    }

    #[test]
    fn whole_steps_uses_are_found() {
        assert_eq!(whole_steps_uses("{% for s in steps %}{% endfor %}"), [12]);
        assert_eq!(whole_steps_uses("{{ steps[name] }}"), [3]);
        assert!(whole_steps_uses("{{ steps.a.output }} steps").is_empty());
    }

    #[test]
    fn variables_are_found_outside_strings_and_attributes() {
        let text = "x {{ 'x' ~ a.x }}\n{{ x }}";
        assert_eq!(find_variable(text, "x"), Some(21));
        assert_eq!(find_variable("{{ other }}", "x"), None);
    }

    #[test]
    fn unclosed_tags_do_not_panic() {
        let regions = tag_regions("{{ steps.a");
        assert_eq!((regions.len(), regions.first()), (1, Some(&(2..10))));
        assert_eq!(ids("{{ steps.a"), [("a".to_owned(), 9, None)]);
        assert!(tag_regions("{").is_empty());
        assert!(tag_regions("{% raw %}{{ x").is_empty());
    }
}
