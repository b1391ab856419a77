//! Config parsing: any text either validates or yields errors with paths,
//! never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Err(errors) = palletd::config::parse(text, None) {
            assert!(!errors.is_empty());
        }
    }
});
