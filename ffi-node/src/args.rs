//! JavaScript values to what platform takes: numbers, keys, byte ranges,
//! option objects. A value of the wrong kind is a `TypeError`, one out of
//! range a `RangeError`, each naming the argument.

use std::fmt::{self, Display};

use napi::bindgen_prelude::{JsObjectValue, Object};
use napi::{Env, JsValue, Unknown, ValueType};

use cxlkv_platform::kv::Key;

use crate::error::{range_error, type_error};
use crate::js;
use crate::tasks::Held;

/// The largest integer a JavaScript number holds exactly.
const MAX_SAFE: u64 = (1 << 53) - 1;

/// Element `.1` of argument `.0`, as a message names it (`keys[3]`), made
/// only when a message needs it.
pub(crate) struct At<D>(pub D, pub usize);

impl<D: Display> Display for At<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.0, self.1)
    }
}

/// Field `.1` of options `.0`, as a message names it (`options.leaseMs`).
pub(crate) struct Field<'a>(&'static str, &'a str);

impl Display for Field<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

/// How a message names a value's kind.
fn describe(v: &Unknown<'_>) -> &'static str {
    match v.get_type() {
        Ok(ValueType::Undefined) => "undefined",
        Ok(ValueType::Null) => "null",
        Ok(ValueType::Boolean) => "a boolean",
        Ok(ValueType::Number) => "a number",
        Ok(ValueType::String) => "a string",
        Ok(ValueType::Symbol) => "a symbol",
        Ok(ValueType::Function) => "a function",
        Ok(ValueType::BigInt) => "a bigint",
        Ok(ValueType::Object) if js::is_array(v.value().env, v.raw()).unwrap_or(false) => "an array",
        Ok(ValueType::Object) => "an object",
        _ => "an unknown value",
    }
}

/// Whether `v` is `undefined` or `null` (an optional argument left out).
pub(crate) fn absent(v: &Unknown<'_>) -> bool {
    matches!(v.get_type(), Ok(ValueType::Undefined | ValueType::Null))
}

/// A non-negative integer up to `max`: a number, or a bigint.
pub(crate) fn uint(env: &Env, v: &Unknown<'_>, what: impl Display, max: u64) -> napi::Result<u64> {
    match v.get_type()? {
        ValueType::Number => {
            // SAFETY: `v` is a number (checked above).
            let x = unsafe { v.cast::<f64>() }?;
            let top = max.min(MAX_SAFE);
            if !(x.fract() == 0.0 && x >= 0.0 && x <= top as f64) {
                return Err(range_error(env, &format!("{what} must be an integer in 0..={top}, got {x}")));
            }
            Ok(x as u64)
        }
        ValueType::BigInt => match js::bigint_u128(env.raw(), v.raw())? {
            Some(x) if x <= u128::from(max) => Ok(x as u64),
            _ => Err(range_error(env, &format!("{what} must be in 0..={max}"))),
        },
        _ => Err(type_error(env, &format!("{what} must be a number, got {}", describe(v)))),
    }
}

/// A `u32` argument.
pub(crate) fn u32_of(env: &Env, v: &Unknown<'_>, what: impl Display) -> napi::Result<u32> {
    Ok(uint(env, v, what, u64::from(u32::MAX))? as u32)
}

/// A `u64` argument (a number up to 2**53-1, or a bigint).
pub(crate) fn u64_of(env: &Env, v: &Unknown<'_>, what: impl Display) -> napi::Result<u64> {
    uint(env, v, what, u64::MAX)
}

/// A finite number argument.
pub(crate) fn f64_of(env: &Env, v: &Unknown<'_>, what: impl Display) -> napi::Result<f64> {
    if v.get_type()? != ValueType::Number {
        return Err(type_error(env, &format!("{what} must be a number, got {}", describe(v))));
    }
    // SAFETY: `v` is a number (checked above).
    let x = unsafe { v.cast::<f64>() }?;
    if !x.is_finite() {
        return Err(range_error(env, &format!("{what} must be finite, got {x}")));
    }
    Ok(x)
}

/// A boolean argument.
pub(crate) fn bool_of(env: &Env, v: &Unknown<'_>, what: impl Display) -> napi::Result<bool> {
    if v.get_type()? != ValueType::Boolean {
        return Err(type_error(env, &format!("{what} must be a boolean, got {}", describe(v))));
    }
    // SAFETY: `v` is a boolean (checked above).
    unsafe { v.cast::<bool>() }
}

/// A string argument.
pub(crate) fn string_of(env: &Env, v: &Unknown<'_>, what: impl Display) -> napi::Result<String> {
    if v.get_type()? != ValueType::String {
        return Err(type_error(env, &format!("{what} must be a string, got {}", describe(v))));
    }
    // SAFETY: `v` is a string (checked above).
    unsafe { v.cast::<String>() }
}

/// The elements of an array argument.
pub(crate) fn elements<'e>(env: &Env, v: &Unknown<'e>, what: impl Display) -> napi::Result<Vec<Unknown<'e>>> {
    if !js::is_array(env.raw(), v.raw())? {
        return Err(type_error(env, &format!("{what} must be an array, got {}", describe(v))));
    }
    let raw = js::array_elements(env.raw(), v.raw())?;
    // SAFETY: values of the running call's env.
    Ok(raw.into_iter().map(|e| unsafe { Unknown::from_raw_unchecked(env.raw(), e) }).collect())
}

/// The byte range of a buffer argument (`Buffer`, any typed array,
/// `DataView` or `ArrayBuffer`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bytes {
    /// First byte.
    pub ptr: *mut u8,
    /// Length in bytes.
    pub len: usize,
}

impl Bytes {
    /// The bytes, to read.
    ///
    /// # Safety
    /// The buffer they come from must be alive (held by the call or by a
    /// reference) and not written by anyone else during the borrow.
    pub(crate) unsafe fn slice<'a>(self) -> &'a [u8] {
        if self.len == 0 || self.ptr.is_null() {
            return &[];
        }
        // SAFETY: the caller holds the buffer: `len` readable bytes at `ptr`.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, to write.
    ///
    /// # Safety
    /// As [`Bytes::slice`], and no other borrow of these bytes may live (the
    /// ranges of one call are checked disjoint).
    pub(crate) unsafe fn slice_mut<'a>(self) -> &'a mut [u8] {
        if self.len == 0 || self.ptr.is_null() {
            return &mut [];
        }
        // SAFETY: the caller holds the buffer and no other borrow of it.
        unsafe { core::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// A buffer argument's bytes.
pub(crate) fn bytes_of(env: &Env, v: &Unknown<'_>, what: impl Display) -> napi::Result<Bytes> {
    match js::bytes(env.raw(), v.raw())? {
        Some((ptr, len)) => Ok(Bytes { ptr, len }),
        None => Err(type_error(
            env,
            &format!("{what} must be a Buffer, TypedArray, DataView or ArrayBuffer, got {}", describe(v)),
        )),
    }
}

/// One buffer, or an array of buffers stored one after the other (K and V,
/// per layer); each held in `held` when given (an async call's).
pub(crate) fn parts_of(
    env: &Env,
    v: &Unknown<'_>,
    what: impl Display,
    held: Option<&mut Held>,
) -> napi::Result<Vec<Bytes>> {
    if !js::is_array(env.raw(), v.raw())? {
        let b = bytes_of(env, v, what)?;
        if let Some(h) = held {
            h.hold(env, v)?;
        }
        return Ok(vec![b]);
    }
    let items = elements(env, v, &what)?;
    let mut held = held;
    let mut parts = Vec::with_capacity(items.len());
    for (i, p) in items.iter().enumerate() {
        parts.push(bytes_of(env, p, At(&what, i))?);
        if let Some(h) = held.as_deref_mut() {
            h.hold(env, p)?;
        }
    }
    Ok(parts)
}

/// Refuses buffers that overlap (two items of a `get` writing one byte).
pub(crate) fn disjoint(env: &Env, all: &[Bytes]) -> napi::Result<()> {
    let mut r: Vec<(usize, usize)> = all.iter().filter(|b| b.len > 0).map(|b| (b.ptr as usize, b.len)).collect();
    r.sort_unstable();
    if r.windows(2).any(|w| w[0].0.saturating_add(w[0].1) > w[1].0) {
        return Err(range_error(env, "the buffers of a get overlap"));
    }
    Ok(())
}

/// A key: a `Buffer` (or any 16-byte view) with the key's 16 bytes, low half
/// first, or a `bigint` below 2**128.
pub(crate) fn key_of(env: &Env, v: &Unknown<'_>, what: impl Display) -> napi::Result<Key> {
    if v.get_type()? == ValueType::BigInt {
        return match js::bigint_u128(env.raw(), v.raw())? {
            Some(x) => Ok(Key::from_u128(x)),
            None => Err(range_error(env, &format!("{what}: a bigint key must be in 0..2**128"))),
        };
    }
    match js::bytes(env.raw(), v.raw())? {
        Some((p, 16)) => {
            let b = Bytes { ptr: p, len: 16 };
            let mut k = [0u8; 16];
            // SAFETY: the argument is held by the running call and nothing
            // runs JavaScript while it is read.
            k.copy_from_slice(unsafe { b.slice() });
            Ok(Key::from_bytes(k))
        }
        Some((_, n)) => Err(range_error(env, &format!("{what}: a key is 16 bytes, got {n}"))),
        None => Err(type_error(env, &format!("{what}: a key is a 16-byte Buffer or a bigint, got {}", describe(v)))),
    }
}

/// Keys: an array of keys, or one buffer of 16-byte keys back to back.
pub(crate) fn keys_of(env: &Env, v: &Unknown<'_>, what: impl Display) -> napi::Result<Vec<Key>> {
    if let Some((p, n)) = js::bytes(env.raw(), v.raw())? {
        if n % 16 != 0 {
            return Err(range_error(env, &format!("{what}: packed keys are 16 bytes each, got {n} bytes")));
        }
        // SAFETY: the argument is held by the running call and nothing runs
        // JavaScript while it is read.
        let all = unsafe { Bytes { ptr: p, len: n }.slice() };
        return Ok(all.chunks_exact(16).map(|c| Key::from_bytes(c.try_into().unwrap_or_default())).collect());
    }
    if !js::is_array(env.raw(), v.raw())? {
        return Err(type_error(
            env,
            &format!("{what} must be an array of keys or a buffer of 16-byte keys, got {}", describe(v)),
        ));
    }
    elements(env, v, &what)?.iter().enumerate().map(|(i, k)| key_of(env, k, At(&what, i))).collect()
}

/// A namespace id (a `u32`).
pub(crate) fn ns_of(env: &Env, v: &Unknown<'_>) -> napi::Result<u32> {
    u32_of(env, v, "ns")
}

/// An options object: its fields, read by name; a field it does not know
/// (a misspelt option) is a `TypeError`.
pub(crate) struct Opts<'e> {
    env: &'e Env,
    obj: Option<Object<'e>>,
    what: &'static str,
}

impl<'e> Opts<'e> {
    /// The options `v` (absent: every option left out), knowing `fields`.
    pub(crate) fn of(env: &'e Env, v: &Unknown<'e>, what: &'static str, fields: &[&str]) -> napi::Result<Opts<'e>> {
        if absent(v) {
            return Ok(Opts { env, obj: None, what });
        }
        if v.get_type()? != ValueType::Object || js::is_array(env.raw(), v.raw())? {
            return Err(type_error(env, &format!("{what} must be an object, got {}", describe(v))));
        }
        // SAFETY: `v` is an object (checked above).
        let obj = unsafe { v.cast::<Object<'e>>() }?;
        for name in Object::keys(&obj)? {
            if !fields.contains(&name.as_str()) {
                return Err(type_error(
                    env,
                    &format!("{what}: unknown option {name:?} (known: {})", fields.join(", ")),
                ));
            }
        }
        Ok(Opts { env, obj: Some(obj), what })
    }

    fn field(&self, name: &str) -> napi::Result<Option<Unknown<'e>>> {
        let Some(o) = &self.obj else { return Ok(None) };
        let v: Unknown<'e> = o.get_named_property(name)?;
        Ok((!absent(&v)).then_some(v))
    }

    fn named<'n>(&self, name: &'n str) -> Field<'n> {
        Field(self.what, name)
    }

    /// A `u32` option.
    pub(crate) fn u32(&self, name: &str) -> napi::Result<Option<u32>> {
        self.field(name)?.map(|v| u32_of(self.env, &v, self.named(name))).transpose()
    }

    /// A `u64` option.
    pub(crate) fn u64(&self, name: &str) -> napi::Result<Option<u64>> {
        self.field(name)?.map(|v| u64_of(self.env, &v, self.named(name))).transpose()
    }

    /// A number option.
    pub(crate) fn f64(&self, name: &str) -> napi::Result<Option<f64>> {
        self.field(name)?.map(|v| f64_of(self.env, &v, self.named(name))).transpose()
    }

    /// A boolean option.
    pub(crate) fn bool(&self, name: &str) -> napi::Result<Option<bool>> {
        self.field(name)?.map(|v| bool_of(self.env, &v, self.named(name))).transpose()
    }

    /// A string option.
    pub(crate) fn string(&self, name: &str) -> napi::Result<Option<String>> {
        self.field(name)?.map(|v| string_of(self.env, &v, self.named(name))).transpose()
    }

    /// An option of any kind (the caller converts it).
    pub(crate) fn value(&self, name: &str) -> napi::Result<Option<Unknown<'e>>> {
        self.field(name)
    }
}

/// `snake_case` as `camelCase`.
pub(crate) fn camel(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut up = false;
    for c in name.chars() {
        if c == '_' {
            up = true;
        } else if up {
            out.extend(c.to_uppercase());
            up = false;
        } else {
            out.push(c);
        }
    }
    out
}
