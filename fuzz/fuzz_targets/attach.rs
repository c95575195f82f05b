//! A region made of arbitrary bytes: attach, check, inspect and operations
//! must return errors, never crash or touch memory outside the region.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cxlkv_tests::fuzz::attach_target(data));
