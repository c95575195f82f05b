//! Errors as JavaScript receives them: `Error` objects whose `code` is a
//! result code's name (as `CXLKV_RESULT_<NAME>` in C, without the prefix)
//! and `result` its number; `errno` too for an operating-system error. Bad
//! arguments are `TypeError` (wrong kind of value) or `RangeError` (a value
//! out of range), with code `INVALID_ARGUMENT`.

use napi::bindgen_prelude::{JsObjectValue, Object};
use napi::{Env, JsError, JsRangeError, JsTypeError};

use cxlkv_platform::kv::CoreError;
use cxlkv_platform::{Code, Error as PlatformError, Family};

/// The constructor of a thrown error.
#[derive(Clone, Copy)]
enum Class {
    Error,
    Type,
    Range,
}

/// A thrown error of `class` with `code`, its number in `result`, and
/// `errno` when an OS call failed.
fn build(env: &Env, class: Class, code: Code, msg: &str, errno: Option<i32>) -> napi::Error {
    let e = napi::Error::new(code.name().to_string(), msg.to_string());
    let value = match class {
        Class::Error => JsError::from(e).into_unknown(*env),
        Class::Type => JsTypeError::from(e).into_unknown(*env),
        Class::Range => JsRangeError::from(e).into_unknown(*env),
    };
    // SAFETY: `into_unknown` made an error object, which is an object.
    if let Ok(mut o) = unsafe { value.cast::<Object>() } {
        let _ = o.set_named_property("result", code as u32);
        if let Some(n) = errno {
            let _ = o.set_named_property("errno", n);
        }
    }
    napi::Error::from(value)
}

/// A `TypeError`: an argument of the wrong kind.
pub(crate) fn type_error(env: &Env, msg: &str) -> napi::Error {
    build(env, Class::Type, Code::InvalidArgument, msg, None)
}

/// A `RangeError`: an argument out of range.
pub(crate) fn range_error(env: &Env, msg: &str) -> napi::Error {
    build(env, Class::Range, Code::InvalidArgument, msg, None)
}

/// The error of result `code` (its own message when `msg` is empty).
pub(crate) fn coded(env: &Env, code: Code, msg: &str) -> napi::Error {
    let msg = if msg.is_empty() { code.message() } else { msg };
    let class = if code.family() == Family::InvalidArgument { Class::Range } else { Class::Error };
    build(env, class, code, msg, None)
}

/// The error of a platform failure.
pub(crate) fn platform(env: &Env, e: &PlatformError) -> napi::Error {
    let code = Code::of(e);
    let errno = match e {
        PlatformError::Io { err, .. } => err.raw_os_error(),
        _ => None,
    };
    let class = if code.family() == Family::InvalidArgument { Class::Range } else { Class::Error };
    build(env, class, code, &e.to_string(), errno)
}

/// A failed call's error, thrown in JavaScript.
pub(crate) trait OrThrow<T> {
    /// The value, or the error as JavaScript receives it.
    fn or_throw(self, env: &Env) -> napi::Result<T>;
}

impl<T> OrThrow<T> for cxlkv_platform::Result<T> {
    fn or_throw(self, env: &Env) -> napi::Result<T> {
        self.map_err(|e| platform(env, &e))
    }
}

impl<T> OrThrow<T> for Result<T, CoreError> {
    fn or_throw(self, env: &Env) -> napi::Result<T> {
        self.map_err(|e| platform(env, &e.into()))
    }
}

/// The name of a per-item result (`"OK"`, `"EXISTS"`, ...).
pub(crate) fn item(r: &Result<(), CoreError>) -> String {
    match r {
        Ok(()) => Code::Ok.name().to_string(),
        Err(e) => Code::from(*e).name().to_string(),
    }
}

/// A failure carried from a worker thread to the JavaScript thread, where it
/// becomes an error object.
pub enum Failure {
    /// A platform failure.
    Platform(PlatformError),
    /// A result code with a message.
    Coded(Code, String),
    /// A panic caught in the worker.
    Panic,
}

impl Failure {
    /// The error as JavaScript receives it.
    pub(crate) fn throw(&self, env: &Env) -> napi::Error {
        match self {
            Failure::Platform(e) => platform(env, e),
            Failure::Coded(c, m) => coded(env, *c, m),
            Failure::Panic => {
                coded(env, Code::Panic, "cxlkv panicked in a worker thread (a bug): nothing was changed by it")
            }
        }
    }
}

impl From<PlatformError> for Failure {
    fn from(e: PlatformError) -> Self {
        Failure::Platform(e)
    }
}

impl From<CoreError> for Failure {
    fn from(e: CoreError) -> Self {
        Failure::Platform(e.into())
    }
}
