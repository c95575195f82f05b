//! Arbitrary operation scripts over three simulated hosts on non-coherent
//! memory, crashes included, checked against a model of what was published.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = cxlkv_tests::fuzz::ops_target(data);
});
