//! The async forms: a call's work runs on the libuv thread pool and its
//! Promise settles on the JavaScript thread, so the event loop keeps
//! running while a node attaches, a batch is copied, recovery or a check
//! runs, or a receive waits.
//!
//! The buffers a call reads or fills are held by strong references until it
//! settled (they cannot be collected meanwhile); the caller must not write
//! to, transfer or detach them before then, as with `fs.read`.
//!
//! A call that waits for someone else (a receive, an RPC's answer) runs on
//! a thread of its own instead ([`waiting`]): libuv's pool has four threads
//! by default, which a few pending receives would otherwise hold for their
//! whole timeout (starving `fs`, `dns` and `zlib`), and a process exit
//! would wait for them.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use napi::bindgen_prelude::{Object, ToNapiValue, TypeName};
use napi::{sys, Env, JsValue, Task, Unknown};

use cxlkv_platform::Node as Attached;

use crate::error::Failure;
use crate::js;

/// JavaScript values a call keeps alive until it settled.
#[derive(Default)]
pub(crate) struct Held(Vec<sys::napi_ref>);

// SAFETY: the references are only made, read and deleted on the JavaScript
// thread (`hold` in the call, `release` in `finally`); the worker thread
// only moves the vector along with the task.
unsafe impl Send for Held {}

impl Held {
    /// Keeps `v` alive until [`Held::release`].
    pub(crate) fn hold(&mut self, env: &Env, v: &Unknown<'_>) -> napi::Result<()> {
        self.0.push(js::reference(env.raw(), v.raw(), 1)?);
        Ok(())
    }

    fn release(&mut self, env: &Env) {
        for r in self.0.drain(..) {
            js::unreference(env.raw(), r);
        }
    }
}

/// The work of a call, run on a worker thread.
type Work<T> = Box<dyn FnOnce() -> Result<T, Failure> + Send>;

/// An async call: its Promise settles with `J`, made from the work's `T`.
pub type Pending<T, J> = napi::bindgen_prelude::AsyncTask<Job<T, J>>;

/// One async call: its work, how its result becomes a JavaScript value, and
/// what it holds meanwhile.
pub struct Job<T: Send + 'static, J> {
    work: Option<Work<T>>,
    done: fn(&Env, T) -> napi::Result<J>,
    held: Held,
    /// The node the call runs on, kept until its Promise settled: the node
    /// cannot detach meanwhile.
    node: Option<Arc<Attached>>,
}

impl<T: Send + 'static, J> Job<T, J> {
    /// A job running `work`, settled by `done`.
    pub(crate) fn new(
        work: impl FnOnce() -> Result<T, Failure> + Send + 'static,
        done: fn(&Env, T) -> napi::Result<J>,
    ) -> Self {
        Job { work: Some(Box::new(work)), done, held: Held::default(), node: None }
    }

    /// The same job, keeping `node` attached until it settled.
    pub(crate) fn on(mut self, node: Arc<Attached>) -> Self {
        self.node = Some(node);
        self
    }

    /// The same job, holding `held` until it settled.
    pub(crate) fn holding(mut self, held: Held) -> Self {
        self.held = held;
        self
    }
}

impl<T: Send + 'static, J: ToNapiValue + TypeName> Task for Job<T, J> {
    type Output = Result<T, Failure>;
    type JsValue = J;

    fn compute(&mut self) -> napi::Result<Self::Output> {
        let Some(work) = self.work.take() else {
            return Ok(Err(Failure::Panic));
        };
        // A panic is a bug; it must not cross into libuv.
        Ok(catch_unwind(AssertUnwindSafe(work)).unwrap_or(Err(Failure::Panic)))
    }

    fn resolve(&mut self, env: Env, output: Self::Output) -> napi::Result<J> {
        match output {
            Ok(t) => (self.done)(&env, t),
            Err(f) => Err(f.throw(&env)),
        }
    }

    fn finally(mut self, env: Env) -> napi::Result<()> {
        self.held.release(&env);
        self.node = None;
        Ok(())
    }
}

/// How a waiting call's Promise settles, on the JavaScript thread.
type Settle<J> = Box<dyn FnOnce(Env) -> napi::Result<J>>;

/// Runs `work` (a wait for a message or an answer) on a thread of its own
/// and returns a Promise settled with `done` of its result on the
/// JavaScript thread; `node` stays attached until then. Not the libuv pool:
/// see the module notes. The pending Promise keeps the event loop alive, as
/// a pending timer does; `process.exit` does not wait for the thread.
pub(crate) fn waiting<'env, T: Send + 'static, J: ToNapiValue + 'static>(
    env: &'env Env,
    node: Arc<Attached>,
    work: impl FnOnce() -> Result<T, Failure> + Send + 'static,
    done: fn(&Env, T) -> napi::Result<J>,
) -> napi::Result<Object<'env>> {
    let (deferred, promise) = env.create_deferred::<J, Settle<J>>()?;
    let spawned = std::thread::Builder::new().name("cxlkv-wait".into()).spawn(move || {
        // A panic is a bug; it must not cross into Node.
        let r = catch_unwind(AssertUnwindSafe(work)).unwrap_or(Err(Failure::Panic));
        deferred.resolve(Box::new(move |env: Env| {
            drop(node);
            match r {
                Ok(t) => done(&env, t),
                Err(f) => Err(f.throw(&env)),
            }
        }));
    });
    match spawned {
        Ok(_) => Ok(promise),
        Err(e) => Err(napi::Error::from_reason(format!("cannot start a waiting thread: {e}"))),
    }
}
