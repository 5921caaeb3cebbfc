//! Builds the positioned tree from the YAML parser's events.
//!
//! JSON files go through the same parser (YAML 1.2 reads JSON), so they get positions too.

use std::collections::HashMap;

use granit_parser::{Event, Marker, Options, Parser, ScalarStyle as ParserStyle, Span};

use super::{Node, ScalarStyle, Value};
use crate::diag::Pos;

/// Nesting deeper than this is refused instead of risking the stack.
const MAX_DEPTH: usize = 200;
/// Aliases may not expand the document beyond this many nodes ("billion laughs").
const MAX_NODES: usize = 1_000_000;

/// A syntax error with its position.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LoadError {
    pub(crate) pos: Pos,
    pub(crate) message: String,
}

enum Frame {
    Seq(Pos, usize, Vec<Node>),
    Map(Pos, usize, Vec<(Node, Node)>, Option<Node>),
}

/// Parses the first document of `text`. An empty document is `Ok(None)`.
pub(crate) fn parse(text: &str) -> Result<Option<Node>, LoadError> {
    let mut stack: Vec<Frame> = Vec::new();
    let mut anchors: HashMap<usize, Node> = HashMap::new();
    let mut root: Option<Node> = None;
    let mut node_count = 0usize;
    for event in Parser::new_from_str_with_options(text, options()) {
        let (event, span) = event.map_err(|e| {
            let mut pos = marker_pos(e.marker(), 1);
            let message = e.info();
            // The scanner reports a tab at the start of the token it was reading (a plain
            // scalar may span lines); point at the indentation tab itself.
            if message.contains("found a tab")
                && let Some(tab) = indentation_tab(text, pos.line)
            {
                pos = tab;
            }
            LoadError { pos, message }
        })?;
        let node = match event {
            Event::Scalar(value, style, anchor, _) => {
                let style = match style {
                    ParserStyle::Plain => ScalarStyle::Plain,
                    ParserStyle::SingleQuoted | ParserStyle::DoubleQuoted => ScalarStyle::Quoted,
                    ParserStyle::Literal | ParserStyle::Folded => ScalarStyle::Block,
                };
                let node = Node {
                    pos: span_pos(&span),
                    value: Value::Scalar(value.into_owned(), style),
                };
                if anchor != 0 {
                    anchors.insert(anchor, node.clone());
                }
                node
            }
            Event::SequenceStart(_, anchor, _) => {
                if stack.len() >= MAX_DEPTH {
                    return Err(too_deep(&span));
                }
                stack.push(Frame::Seq(span_pos(&span), anchor, Vec::new()));
                continue;
            }
            Event::MappingStart(_, anchor, _) => {
                if stack.len() >= MAX_DEPTH {
                    return Err(too_deep(&span));
                }
                stack.push(Frame::Map(span_pos(&span), anchor, Vec::new(), None));
                continue;
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let (node, anchor) = match stack.pop() {
                    Some(Frame::Seq(pos, anchor, items)) => (
                        Node {
                            pos,
                            value: Value::Seq(items),
                        },
                        anchor,
                    ),
                    Some(Frame::Map(pos, anchor, entries, _)) => (
                        Node {
                            pos,
                            value: Value::Map(entries),
                        },
                        anchor,
                    ),
                    None => continue,
                };
                if anchor != 0 {
                    anchors.insert(anchor, node.clone());
                }
                node
            }
            Event::Alias(id) => {
                let Some(target) = anchors.get(&id) else {
                    return Err(LoadError {
                        pos: span_pos(&span),
                        message: "unknown alias".into(),
                    });
                };
                node_count += count_nodes(target);
                if node_count > MAX_NODES {
                    return Err(LoadError {
                        pos: span_pos(&span),
                        message: format!("aliases expand the document beyond {MAX_NODES} nodes"),
                    });
                }
                let mut node = target.clone();
                node.pos = span_pos(&span);
                node
            }
            Event::DocumentEnd => {
                if root.is_some() {
                    break;
                }
                continue;
            }
            _ => continue,
        };
        node_count += 1;
        match stack.last_mut() {
            Some(Frame::Seq(_, _, items)) => items.push(node),
            Some(Frame::Map(_, _, entries, pending)) => match pending.take() {
                Some(key) => entries.push((key, node)),
                None => *pending = Some(node),
            },
            None => root = Some(node),
        }
    }
    Ok(root)
}

/// The parser's options: a block scalar ending the file without a final line break gains
/// none, as libyaml (goose's parser, through serde_yaml) reads it: `p: |\n  a` is `"a"`.
fn options() -> Options {
    let mut options = Options::default();
    options.block_scalar_eof_without_line_feed = true;
    options
}

fn count_nodes(node: &Node) -> usize {
    match &node.value {
        Value::Scalar(..) => 1,
        Value::Seq(items) => 1 + items.iter().map(count_nodes).sum::<usize>(),
        Value::Map(entries) => {
            1 + entries
                .iter()
                .map(|(k, v)| count_nodes(k) + count_nodes(v))
                .sum::<usize>()
        }
    }
}

fn too_deep(span: &Span) -> LoadError {
    LoadError {
        pos: span_pos(span),
        message: format!("nesting deeper than {MAX_DEPTH} levels"),
    }
}

/// The first tab in a line's indentation, at or after line `from` (1-based).
fn indentation_tab(text: &str, from: u32) -> Option<Pos> {
    text.lines()
        .enumerate()
        .skip(usize::try_from(from).ok()?.saturating_sub(1))
        .find_map(|(index, line)| {
            let indent = &line[..line.len() - line.trim_start().len()];
            let col = indent.chars().position(|c| c == '\t')?;
            Some(Pos::new(
                u32::try_from(index + 1).ok()?,
                u32::try_from(col + 1).ok()?,
                1,
            ))
        })
}

fn marker_pos(marker: &Marker, len: u32) -> Pos {
    Pos::new(
        u32::try_from(marker.line()).unwrap_or(u32::MAX).max(1),
        u32::try_from(marker.col())
            .unwrap_or(u32::MAX)
            .saturating_add(1),
        len,
    )
}

fn span_pos(span: &Span) -> Pos {
    let len = if span.end.line() == span.start.line() {
        span.end.col().saturating_sub(span.start.col()).max(1)
    } else {
        1
    };
    marker_pos(&span.start, u32::try_from(len).unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_of_keys_and_values() {
        let doc = parse("title: Hi\nparameters:\n  - key: a\n    input_type: string\n")
            .unwrap()
            .unwrap();
        let params = doc.get("parameters").unwrap().as_seq().unwrap();
        let first = &params[0];
        let (key, value) = &first.as_map().unwrap()[1];
        assert_eq!(key.as_str(), Some("input_type"));
        assert_eq!((key.pos.line, key.pos.col), (4, 5));
        assert_eq!((value.pos.line, value.pos.col, value.pos.len), (4, 17, 6));
    }

    #[test]
    fn json_is_read_with_positions() {
        let doc = parse("{\n  \"title\": \"x\",\n  \"n\": 5\n}\n")
            .unwrap()
            .unwrap();
        assert_eq!(doc.get("n").unwrap().to_json(), serde_json::json!(5));
        assert_eq!(doc.get("title").unwrap().pos.line, 2);
    }

    #[test]
    fn syntax_error_has_a_position() {
        let err = parse("a: b\n  c: d\n").unwrap_err();
        assert_eq!(err.pos.line, 2);
    }

    #[test]
    fn aliases_resolve_and_bombs_stop() {
        let doc = parse("a: &x [1, 2]\nb: *x\n").unwrap().unwrap();
        assert_eq!(doc.get("b").unwrap().to_json(), serde_json::json!([1, 2]));
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..9 {
            let prev = format!("*a{}", i - 1);
            bomb.push_str(&format!("a{i}: &a{i} [{}]\n", vec![prev; 10].join(", ")));
        }
        assert!(parse(&bomb).is_err());
    }

    #[test]
    fn block_scalar_at_end_of_input_gains_no_line_feed() {
        let prompt = |text: &str| parse(text).unwrap().unwrap().get("p").unwrap().to_json();
        assert_eq!(prompt("p: |\n  a\n  b"), serde_json::json!("a\nb"));
        assert_eq!(prompt("p: >\n  a\n  b"), serde_json::json!("a b"));
        assert_eq!(prompt("p: |\n  a\n  b\n"), serde_json::json!("a\nb\n"));
    }

    #[test]
    fn deep_nesting_is_refused() {
        let text = "[".repeat(10_000);
        assert!(parse(&text).is_err());
    }
}
