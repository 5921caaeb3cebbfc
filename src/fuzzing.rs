//! Entry points for the fuzz targets in `fuzz/` (not part of the public interface).
//!
//! Each function takes arbitrary text, runs it through one parser the way summon reads a
//! file — parse, check, render the diagnostics — and returns nothing. None of them may panic
//! on any input: a panic is a bug, and the fuzzer reports it as a crash. A few invariants that
//! must hold for every input are asserted here too, so breaking them is a crash as well.

use std::path::Path;

use indexmap::IndexMap;

use crate::agent::{AgentDir, AgentParse, parse_agent};
use crate::color::Palette;
use crate::diag::{Diagnostics, SourceFile, render_all};
use crate::pipeline::graph::Graph;
use crate::pipeline::parse::parse_pipeline;
use crate::recipe::{Strictness, check_templates, parse_recipe, render_recipe};
use crate::template;

/// A directory that does not exist, so a fuzzed `include` finds nothing to read.
const FUZZ_DIR: &str = "/nonexistent-summon-fuzz";

/// A value that tries template injection: it must come out of every render as it went in.
const HOSTILE_VALUE: &str = "{{ 7*7 }} {% include '/etc/passwd' %}";

fn report(diags: &Diagnostics) {
    let _ = render_all(&diags.items, Path::new("/"), Palette::default());
}

/// A recipe file (`.yaml`): parsed strictly and leniently, its templates checked, and rendered
/// with each parameter's default (or a hostile value when it has none).
pub fn recipe(text: &str) {
    let file = SourceFile::new(format!("{FUZZ_DIR}/recipe.yaml"), text);
    for strictness in [Strictness::Strict, Strictness::Lenient] {
        let mut diags = Diagnostics::default();
        if let Some(recipe) = parse_recipe(&file, strictness, &mut diags) {
            check_templates(&recipe, &mut diags);
            let values: IndexMap<String, String> = recipe
                .parameters
                .iter()
                .map(|p| {
                    let value = p.default.clone().unwrap_or_else(|| HOSTILE_VALUE.into());
                    (p.key.clone(), value)
                })
                .collect();
            if let Err(errors) = render_recipe(&recipe, &values) {
                report(&errors);
            }
        }
        report(&diags);
    }
}

/// An agent definition (`.md` with frontmatter), read as a project role and as any other agent.
pub fn agent(text: &str) {
    let file = SourceFile::new(format!("{FUZZ_DIR}/agent.md"), text);
    for dir in [AgentDir::Project, AgentDir::Other] {
        let mut diags = Diagnostics::default();
        if let AgentParse::Agent(def) = parse_agent(&file, dir, &mut diags) {
            assert!(!def.name.is_empty(), "an agent without a name was loaded");
        }
        report(&diags);
    }
}

/// A pipeline file: parsed and validated, and its dependency graph built when it is valid.
pub fn pipeline(text: &str) {
    let file = SourceFile::new(format!("{FUZZ_DIR}/pipeline.yaml"), text);
    let mut diags = Diagnostics::default();
    if let Some(pipeline) = parse_pipeline(&file, &mut diags) {
        let graph = Graph::new(&pipeline);
        assert!(
            graph.cycles().is_empty(),
            "a pipeline with a dependency cycle passed validation"
        );
        assert_eq!(graph.order().len(), pipeline.steps.len());
    }
    report(&diags);
}

/// A template: its variables listed and the text rendered with a context whose values are
/// the input itself. Whatever the template, a value substituted into it stays literal text.
pub fn template(text: &str) {
    let _ = template::variables(text);
    let env = template::environment(Some(Path::new(FUZZ_DIR)));
    let context = minijinja::context! { item => text, value => HOSTILE_VALUE };
    let _ = template::render(&env, text, &context);
    let echoed = template::render(&env, "{{ item }}", &context);
    assert_eq!(
        echoed.as_deref(),
        Ok(text),
        "a substituted value did not stay literal"
    );
}
