//! Inputs that once crashed a fuzz target (`fuzz/run.sh`), kept as regression tests: every
//! file in `tests/fixtures/fuzz/TARGET/` goes through the target's entry point again.

use std::path::Path;

fn each_input(target: &str, run: fn(&str)) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fuzz")
        .join(target);
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).expect("fixtures dir") {
        let path = entry.expect("entry").path();
        let bytes = std::fs::read(&path).expect("read input");
        if let Ok(text) = std::str::from_utf8(&bytes) {
            run(text);
            count += 1;
        }
    }
    assert!(count > 0, "no inputs in {}", dir.display());
}

#[test]
fn agent_inputs() {
    each_input("agent", summon::fuzzing::agent);
}
