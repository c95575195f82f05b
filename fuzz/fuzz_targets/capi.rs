//! Arbitrary sequences of C API calls (NULL, closed and foreign handles,
//! stale and forged blocks, bad sizes, names and offsets): never a crash,
//! and every region checks clean at the end.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = cxlkv_tests::capi::capi_target(data);
});
