//! The raw Node-API calls the addon makes itself, each behind a safe
//! function: byte ranges of any buffer, views over the region (external
//! `ArrayBuffer`s) and their detaching, weak and strong references, bigint
//! words.
//!
//! Every function takes the `napi_env` napi-rs handed to the call it runs in,
//! on that environment's JavaScript thread, and values of that call (or of a
//! reference of that environment): the contract of every Node-API function.

use core::ffi::c_void;
use core::ptr;

use napi::sys;

/// The environment of the running call.
pub(crate) type Env = sys::napi_env;
/// A JavaScript value of the running call.
pub(crate) type Value = sys::napi_value;

/// `Ok` for `napi_ok`; otherwise the status as napi-rs reports it (a pending
/// exception is rethrown as is).
fn check(status: sys::napi_status, what: &str) -> napi::Result<()> {
    if status == sys::Status::napi_ok {
        return Ok(());
    }
    Err(napi::Error::new(napi::Status::from(status), format!("{what} failed")))
}

/// The bytes of an element of a typed array of kind `t`.
fn element_size(t: sys::napi_typedarray_type) -> usize {
    use sys::TypedarrayType as T;
    match t {
        T::int16_array | T::uint16_array => 2,
        T::int32_array | T::uint32_array | T::float32_array => 4,
        T::float64_array | T::bigint64_array | T::biguint64_array => 8,
        _ => 1,
    }
}

/// The byte range of `v` when it is an `ArrayBuffer`, a typed array (a
/// `Buffer` is one) or a `DataView`; `None` for any other value. A detached
/// buffer is an empty range.
pub(crate) fn bytes(env: Env, v: Value) -> napi::Result<Option<(*mut u8, usize)>> {
    let mut is = false;
    // SAFETY: `env` and `v` are of the running call; `is` is writable.
    check(unsafe { sys::napi_is_typedarray(env, v, &mut is) }, "napi_is_typedarray")?;
    if is {
        let (mut t, mut n, mut data) = (0, 0usize, ptr::null_mut());
        // SAFETY: `v` is a typed array (checked above); the out pointers are
        // writable locals, and NULL for the values not asked for.
        let st = unsafe {
            sys::napi_get_typedarray_info(env, v, &mut t, &mut n, &mut data, ptr::null_mut(), ptr::null_mut())
        };
        check(st, "napi_get_typedarray_info")?;
        return Ok(Some((data.cast(), n.saturating_mul(element_size(t)))));
    }
    // SAFETY: as above.
    check(unsafe { sys::napi_is_dataview(env, v, &mut is) }, "napi_is_dataview")?;
    if is {
        let (mut n, mut data) = (0usize, ptr::null_mut());
        // SAFETY: `v` is a DataView (checked above); out pointers as above.
        let st = unsafe { sys::napi_get_dataview_info(env, v, &mut n, &mut data, ptr::null_mut(), ptr::null_mut()) };
        check(st, "napi_get_dataview_info")?;
        return Ok(Some((data.cast(), n)));
    }
    // SAFETY: as above.
    check(unsafe { sys::napi_is_arraybuffer(env, v, &mut is) }, "napi_is_arraybuffer")?;
    if is {
        let (mut n, mut data) = (0usize, ptr::null_mut());
        // SAFETY: `v` is an ArrayBuffer (checked above); out pointers as above.
        check(unsafe { sys::napi_get_arraybuffer_info(env, v, &mut data, &mut n) }, "napi_get_arraybuffer_info")?;
        return Ok(Some((data.cast(), n)));
    }
    Ok(None)
}

/// The value of a bigint as an unsigned 128-bit integer; `None` when it is
/// negative or does not fit.
pub(crate) fn bigint_u128(env: Env, v: Value) -> napi::Result<Option<u128>> {
    let (mut sign, mut count) = (0, 0usize);
    // Asked with neither sign nor buffer, the call reports how many words
    // the value has.
    // SAFETY: `v` is a bigint of the running call (the caller checked its
    // type); `count` is writable.
    let st = unsafe { sys::napi_get_value_bigint_words(env, v, ptr::null_mut(), &mut count, ptr::null_mut()) };
    check(st, "napi_get_value_bigint_words")?;
    if count > 2 {
        return Ok(None);
    }
    let mut words = [0u64; 2];
    count = words.len();
    // SAFETY: `words` holds `count` writable words.
    let st = unsafe { sys::napi_get_value_bigint_words(env, v, &mut sign, &mut count, words.as_mut_ptr()) };
    check(st, "napi_get_value_bigint_words")?;
    if sign != 0 && (words[0] | words[1]) != 0 {
        return Ok(None);
    }
    Ok(Some(u128::from(words[0]) | u128::from(words[1]) << 64))
}

/// A new `ArrayBuffer` holding a copy of `data`.
pub(crate) fn arraybuffer_copy(env: Env, data: &[u8]) -> napi::Result<Value> {
    let (mut v, mut dst) = (ptr::null_mut(), ptr::null_mut::<c_void>());
    // SAFETY: the out pointers are writable locals.
    check(unsafe { sys::napi_create_arraybuffer(env, data.len(), &mut dst, &mut v) }, "napi_create_arraybuffer")?;
    if !data.is_empty() {
        // SAFETY: `dst` is the new buffer's `data.len()` bytes, not aliased
        // by `data` (a fresh allocation).
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), dst.cast::<u8>(), data.len()) };
    }
    Ok(v)
}

/// Refused by the runtime: external buffers are not allowed (a V8 sandbox,
/// as in Electron).
pub(crate) struct NoExternal;

/// An `ArrayBuffer` over `len` bytes at `data`, which are not copied. When
/// the buffer is collected, `finalize` runs with `hint`. On `Err(NoExternal)`
/// nothing was made and `finalize` will not run.
///
/// # Safety
/// `data .. data+len` must stay valid for reads and writes until `finalize`
/// runs or the buffer is detached, whichever comes first.
pub(crate) unsafe fn external_arraybuffer(
    env: Env,
    data: *mut u8,
    len: usize,
    finalize: sys::napi_finalize,
    hint: *mut c_void,
) -> napi::Result<Result<Value, NoExternal>> {
    let mut v = ptr::null_mut();
    // SAFETY: the caller keeps the bytes valid as the contract asks; `v` is
    // writable.
    let st = unsafe { sys::napi_create_external_arraybuffer(env, data.cast(), len, finalize, hint, &mut v) };
    if st == sys::Status::napi_no_external_buffers_allowed {
        return Ok(Err(NoExternal));
    }
    check(st, "napi_create_external_arraybuffer")?;
    Ok(Ok(v))
}

/// Detaches the `ArrayBuffer` `v`: its length becomes 0 and every view of
/// it reads nothing. Detaching one twice does nothing.
pub(crate) fn detach(env: Env, v: Value) -> napi::Result<()> {
    let mut done = false;
    // SAFETY: `v` is an ArrayBuffer of this environment (made by this addon,
    // through a reference of it); `done` is writable.
    check(unsafe { sys::napi_is_detached_arraybuffer(env, v, &mut done) }, "napi_is_detached_arraybuffer")?;
    if done {
        return Ok(());
    }
    // SAFETY: as above; the buffer is detachable (made by
    // `external_arraybuffer` or `arraybuffer_copy`).
    check(unsafe { sys::napi_detach_arraybuffer(env, v) }, "napi_detach_arraybuffer")
}

/// A reference to `v`: strong with `count` 1 (keeps it alive), weak with 0.
pub(crate) fn reference(env: Env, v: Value, count: u32) -> napi::Result<sys::napi_ref> {
    let mut r = ptr::null_mut();
    // SAFETY: `v` is of the running call; `r` is writable.
    check(unsafe { sys::napi_create_reference(env, v, count, &mut r) }, "napi_create_reference")?;
    Ok(r)
}

/// The value of reference `r`; `None` once a weak one's value was collected.
pub(crate) fn referenced(env: Env, r: sys::napi_ref) -> napi::Result<Option<Value>> {
    let mut v = ptr::null_mut();
    // SAFETY: `r` is a live reference of this environment (its owner deletes
    // it only through `unreference`); `v` is writable.
    check(unsafe { sys::napi_get_reference_value(env, r, &mut v) }, "napi_get_reference_value")?;
    Ok((!v.is_null()).then_some(v))
}

/// Deletes reference `r` (made by [`reference`]); it must not be used again.
pub(crate) fn unreference(env: Env, r: sys::napi_ref) {
    // SAFETY: `r` is a live reference of this environment, deleted once (its
    // owner forgets it here).
    let _ = unsafe { sys::napi_delete_reference(env, r) };
}

/// Whether `v` is an `Array`.
pub(crate) fn is_array(env: Env, v: Value) -> napi::Result<bool> {
    let mut is = false;
    // SAFETY: `env` and `v` are of the running call; `is` is writable.
    check(unsafe { sys::napi_is_array(env, v, &mut is) }, "napi_is_array")?;
    Ok(is)
}

/// The elements of `v` when it is a `Uint32Array`.
pub(crate) fn u32_elements(env: Env, v: Value) -> napi::Result<Option<Vec<u32>>> {
    let mut is = false;
    // SAFETY: `env` and `v` are of the running call; `is` is writable.
    check(unsafe { sys::napi_is_typedarray(env, v, &mut is) }, "napi_is_typedarray")?;
    if !is {
        return Ok(None);
    }
    let (mut t, mut n, mut data) = (0, 0usize, ptr::null_mut::<c_void>());
    // SAFETY: `v` is a typed array (checked above); the out pointers are
    // writable locals, and NULL for the values not asked for.
    let st =
        unsafe { sys::napi_get_typedarray_info(env, v, &mut t, &mut n, &mut data, ptr::null_mut(), ptr::null_mut()) };
    check(st, "napi_get_typedarray_info")?;
    if t != sys::TypedarrayType::uint32_array {
        return Ok(None);
    }
    if n == 0 || data.is_null() {
        return Ok(Some(Vec::new()));
    }
    // SAFETY: a Uint32Array's data is `n` aligned u32 elements, alive for
    // the running call, which runs no JavaScript while they are copied.
    Ok(Some(unsafe { core::slice::from_raw_parts(data.cast::<u32>(), n) }.to_vec()))
}

/// The elements of the array `v`, holes read as `undefined`.
pub(crate) fn array_elements(env: Env, v: Value) -> napi::Result<Vec<Value>> {
    let mut n = 0u32;
    // SAFETY: `v` is an array of the running call (the caller checked);
    // `n` is writable.
    check(unsafe { sys::napi_get_array_length(env, v, &mut n) }, "napi_get_array_length")?;
    (0..n)
        .map(|i| {
            let mut e = ptr::null_mut();
            // SAFETY: as above; `e` is writable.
            check(unsafe { sys::napi_get_element(env, v, i, &mut e) }, "napi_get_element")?;
            Ok(e)
        })
        .collect()
}
