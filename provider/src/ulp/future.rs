//! A `Future` per request, for any executor: the request's callback
//! stores the completion and wakes the task. The CQ must be driven by
//! something that sleeps on its completion channel's descriptor (a
//! [`CqWorker`](super::CqWorker) or [`CqPool`](super::CqPool)), so nothing
//! busy-polls while a task waits.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use super::qp::{UlpPostError, UlpQp};
use super::wr::{Chain, Sgl};
use crate::verbs::WorkCompletion;

#[derive(Default)]
struct State {
    wc: Option<WorkCompletion>,
    waker: Option<Waker>,
}

/// The completion of one request posted with [`UlpQp::post_async`] or
/// [`UlpQp::recv_async`]: resolves to the completion the callback of
/// [`UlpQp::post`] would get (the last WR's, or the first error or flush).
#[derive(Debug)]
pub struct WrFuture {
    st: Arc<Mutex<State>>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").field("wc", &self.wc).finish_non_exhaustive()
    }
}

/// Completes the future once: with the completion, or, if the callback is
/// dropped uncalled (which the layer does only to requests that were not
/// posted), never.
struct Completer {
    st: Arc<Mutex<State>>,
}

impl Completer {
    fn complete(self, wc: &WorkCompletion) {
        let waker = {
            let mut s = self.st.lock().unwrap_or_else(|p| p.into_inner());
            s.wc = Some(*wc);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

fn pair() -> (WrFuture, Completer) {
    let st = Arc::new(Mutex::new(State::default()));
    (WrFuture { st: st.clone() }, Completer { st })
}

impl Future for WrFuture {
    type Output = WorkCompletion;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<WorkCompletion> {
        let mut s = self.st.lock().unwrap_or_else(|p| p.into_inner());
        match s.wc {
            Some(wc) => Poll::Ready(wc),
            None => {
                match &s.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => s.waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }
}

impl UlpQp {
    /// Posts a signaled request and returns a future of its completion.
    ///
    /// # Errors
    ///
    /// As [`UlpQp::post`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(qp: &softverbs::ulp::UlpQp, buf: softverbs::ulp::LocalBuf) -> Result<(), softverbs::ulp::UlpPostError> {
    /// use softverbs::ulp::UlpWr;
    /// let wc = qp.post_async(vec![UlpWr::send(vec![buf])])?.await;
    /// assert!(wc.is_success());
    /// # Ok(()) }
    /// ```
    pub fn post_async(&self, chain: impl Into<Chain>) -> Result<WrFuture, UlpPostError> {
        let (fut, done) = pair();
        self.post(chain, move |wc| done.complete(wc))?;
        Ok(fut)
    }

    /// Posts a receive and returns a future of its completion.
    ///
    /// # Errors
    ///
    /// As [`UlpQp::post_recv`].
    pub fn recv_async(&self, sgl: impl Into<Sgl>) -> Result<WrFuture, UlpPostError> {
        let (fut, done) = pair();
        self.post_recv(sgl, move |wc| done.complete(wc))?;
        Ok(fut)
    }
}
