//! Arbitrary sequences of C API calls (NULL, closed and foreign handles,
//! stale and forged blocks, bad sizes, names and offsets): never a crash,
//! and every region checks clean at the end. Most inputs reuse one pooled
//! region and its nodes; one in eight attaches its own (the first byte
//! chooses).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = cxlkv_tests::capi::capi_fuzz(data);
});
