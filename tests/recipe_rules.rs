//! goose's recipe rules: template inheritance (`extends`/`include` resolved in the recipe's
//! folder by every command that reads recipes), no defaults for file parameters, goose's
//! retry validation, placeholders that are not expressions kept as text, and block scalars
//! at the end of a file read as goose's YAML parser reads them.

mod support;

use support::*;

// ---- block scalars at the end of a file ----

#[test]
fn block_scalar_at_end_of_file_without_newline_gains_none() {
    for (body, want) in [
        ("|\n  hello\n  world", "hello\nworld"),
        ("|+\n  hello\n  world", "hello\nworld"),
        (">\n  hello\n  world", "hello world"),
        ("|\n  hello\n  world\n", "hello\nworld\n"),
        ("|\n  hello\n  ", "hello\n"),
    ] {
        let out = Test::new()
            .write_raw(
                "recipes/eof.yaml",
                &format!("title: t\ndescription: d\nprompt: {body}"),
            )
            .args(["render", "--source", "eof", "--json"])
            .run();
        assert_eq!(out.json()["prompt"], want, "{body:?}");
    }
}
