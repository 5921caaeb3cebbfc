//! Fuzzes a recipe file: any bytes that are UTF-8 go through [`summon::fuzzing::recipe`].

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        summon::fuzzing::recipe(text);
    }
});
