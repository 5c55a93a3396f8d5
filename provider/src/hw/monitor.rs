//! A device's async event monitor: one thread per device reading the async
//! events of a context of its own (so that no application's events are
//! taken), and translating the device-wide ones.
//!
//! The kernel delivers port events and DEVICE_FATAL to every open context,
//! so a private context hears them all. On DEVICE_FATAL (or when the device
//! stops answering: `EIO`, which the context reports as DEVICE_FATAL) the
//! monitor *closes its context first* — a driver that cannot disassociate
//! user contexts (rxe, siw) holds the device's unregistration until every
//! context is closed — and then reports the device gone. It stops within
//! [`SLICE`] of [`Monitor::stop`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::verbs::backend::ContextOps;
use crate::verbs::{AsyncElement, AsyncEvent, Error, EventType};

/// How long one wait for an event lasts (the stop latency).
pub(crate) const SLICE: Duration = Duration::from_millis(50);

/// Consecutive failed reads after which the device counts as gone.
const MAX_FAILURES: u32 = 20;
/// Pause after a failed read.
const FAILURE_PAUSE: Duration = Duration::from_millis(25);

/// A device-wide event, as the monitor reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HwEvent {
    /// A port became active (`IBV_EVENT_PORT_ACTIVE`).
    PortActive(u8),
    /// A port left the active state (`IBV_EVENT_PORT_ERR`).
    PortErr(u8),
    /// Any other event the private context received (LID, P_Key, GID table
    /// or SM change, client reregistration).
    Other(AsyncEvent),
    /// The device is gone: DEVICE_FATAL, or it stopped answering.
    DeviceFatal,
    /// Reading events keeps failing (reported once before giving up, which
    /// then reports [`HwEvent::DeviceFatal`]).
    Failing(Error),
}

/// What an async event means for the device as a whole.
pub(crate) fn translate(ev: &AsyncEvent) -> HwEvent {
    match (ev.event_type, ev.element) {
        (EventType::DeviceFatal, _) => HwEvent::DeviceFatal,
        (EventType::PortActive, AsyncElement::Port(p)) => HwEvent::PortActive(p),
        (EventType::PortErr, AsyncElement::Port(p)) => HwEvent::PortErr(p),
        _ => HwEvent::Other(*ev),
    }
}

/// A running monitor; dropping it stops it (without waiting).
#[derive(Debug)]
pub(crate) struct Monitor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Monitor {
    /// Starts a thread reading `ctx`'s events and calling `handler` with each
    /// translated one; the last call is [`HwEvent::DeviceFatal`] if the
    /// device went away (after `ctx` was dropped).
    ///
    /// # Errors
    ///
    /// The thread could not be spawned.
    pub(crate) fn spawn(
        name: &str,
        ctx: Arc<dyn ContextOps>,
        mut handler: impl FnMut(HwEvent) + Send + 'static,
    ) -> std::io::Result<Monitor> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("hw-events-{name}"))
            .spawn(move || {
                let fatal = watch(&ctx, &flag, &mut handler);
                // Close the device before anyone acts on its removal.
                drop(ctx);
                if fatal && !flag.load(Ordering::Acquire) {
                    handler(HwEvent::DeviceFatal);
                }
            })?;
        Ok(Monitor {
            stop,
            thread: Some(thread),
        })
    }

    /// Asks the thread to stop (it does within [`SLICE`]); no event is
    /// reported after this returns, except one already being handled.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Stops the thread and waits for it, unless called from it.
    pub(crate) fn join(mut self) {
        self.stop();
        if let Some(t) = self.thread.take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The monitor's loop; `true` if the device went away.
fn watch(ctx: &Arc<dyn ContextOps>, stop: &AtomicBool, handler: &mut impl FnMut(HwEvent)) -> bool {
    let mut failures = 0;
    while !stop.load(Ordering::Acquire) {
        match ctx.get_async_event(Some(SLICE)) {
            Ok(None) => failures = 0,
            Ok(Some(ev)) => {
                failures = 0;
                match translate(&ev) {
                    HwEvent::DeviceFatal => return true,
                    e => handler(e),
                }
            }
            Err(e) => {
                failures += 1;
                if failures == 1 {
                    handler(HwEvent::Failing(e));
                }
                if failures >= MAX_FAILURES {
                    return true;
                }
                std::thread::sleep(FAILURE_PAUSE);
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{mpsc, Mutex};

    use super::*;
    use crate::verbs::backend::{AsyncElement, CompChannelOps, CqOps, PdOps};
    use crate::verbs::{verr, DeviceAttr, ErrorKind, Gid, PortAttr, Result, Verb};

    /// A context whose async events are scripted; `None` entries time out.
    struct Scripted {
        events: Mutex<VecDeque<Option<Result<AsyncEvent>>>>,
        dropped: mpsc::Sender<()>,
    }

    impl Drop for Scripted {
        fn drop(&mut self) {
            let _ = self.dropped.send(());
        }
    }

    fn nope<T>(verb: Verb) -> Result<T> {
        Err(crate::verbs::Error::new(verb, ErrorKind::NotSupported, "scripted"))
    }

    impl ContextOps for Scripted {
        fn device_name(&self) -> &str {
            "scripted"
        }
        fn query_device(&self) -> Result<DeviceAttr> {
            nope(Verb::QueryDevice)
        }
        fn query_port(&self, _: u8) -> Result<PortAttr> {
            nope(Verb::QueryPort)
        }
        fn query_gid(&self, _: u8, _: u32) -> Result<Gid> {
            nope(Verb::QueryGid)
        }
        fn query_pkey(&self, _: u8, _: u16) -> Result<u16> {
            nope(Verb::QueryPkey)
        }
        fn alloc_pd(&self) -> Result<Arc<dyn PdOps>> {
            nope(Verb::AllocPd)
        }
        fn create_comp_channel(&self) -> Result<Arc<dyn CompChannelOps>> {
            nope(Verb::CreateCompChannel)
        }
        fn create_cq(&self, _: u32, _: u64, _: Option<&Arc<dyn CompChannelOps>>, _: u32) -> Result<Arc<dyn CqOps>> {
            nope(Verb::CreateCq)
        }
        fn get_async_event(&self, timeout: Option<Duration>) -> Result<Option<AsyncEvent>> {
            let next = self.events.lock().unwrap().pop_front();
            match next {
                Some(Some(r)) => r.map(Some),
                Some(None) | None => {
                    std::thread::sleep(timeout.unwrap_or(SLICE).min(Duration::from_millis(2)));
                    Ok(None)
                }
            }
        }
        fn async_fd(&self) -> Option<std::os::fd::RawFd> {
            None
        }
    }

    fn ev(event_type: EventType, element: AsyncElement) -> Option<Result<AsyncEvent>> {
        Some(Ok(AsyncEvent { event_type, element }))
    }

    fn run(script: Vec<Option<Result<AsyncEvent>>>) -> (Vec<HwEvent>, mpsc::Receiver<()>, Monitor) {
        let (dtx, drx) = mpsc::channel();
        let ctx = Arc::new(Scripted {
            events: Mutex::new(script.into()),
            dropped: dtx,
        });
        let (tx, rx) = mpsc::channel();
        let m = Monitor::spawn("t", ctx, move |e| {
            let _ = tx.send(e);
        })
        .unwrap();
        let mut got = Vec::new();
        while let Ok(e) = rx.recv_timeout(Duration::from_secs(5)) {
            let last = e == HwEvent::DeviceFatal;
            got.push(e);
            if last {
                break;
            }
        }
        (got, drx, m)
    }

    #[test]
    fn port_events_translate_and_fatal_ends_after_the_context_closed() {
        let qp_fatal = AsyncEvent {
            event_type: EventType::QpFatal,
            element: AsyncElement::Qp(7),
        };
        let (got, dropped, m) = run(vec![
            ev(EventType::PortErr, AsyncElement::Port(1)),
            None,
            ev(EventType::PortActive, AsyncElement::Port(1)),
            Some(Ok(qp_fatal)),
            ev(EventType::GidChange, AsyncElement::Port(2)),
            ev(EventType::DeviceFatal, AsyncElement::Device),
            ev(EventType::PortActive, AsyncElement::Port(2)),
        ]);
        assert_eq!(
            got,
            [
                HwEvent::PortErr(1),
                HwEvent::PortActive(1),
                HwEvent::Other(qp_fatal),
                HwEvent::Other(AsyncEvent {
                    event_type: EventType::GidChange,
                    element: AsyncElement::Port(2)
                }),
                HwEvent::DeviceFatal,
            ],
            "nothing after DEVICE_FATAL"
        );
        dropped
            .try_recv()
            .expect("the monitor's context was closed before DEVICE_FATAL was reported");
        m.join();
    }

    #[test]
    fn persistent_read_failures_count_as_gone_and_stop_is_quiet() {
        let mut script: Vec<_> = (0..MAX_FAILURES)
            .map(|_| Some(Err(verr!(GetAsyncEvent, Io, "read failed"))))
            .collect();
        script.push(ev(EventType::PortActive, AsyncElement::Port(1)));
        let (got, _dropped, m) = run(script);
        assert!(matches!(got[0], HwEvent::Failing(_)), "{got:?}");
        assert_eq!(got[1..], [HwEvent::DeviceFatal]);
        m.join();

        // Stopped: the thread ends without reporting anything.
        let (dtx, drx) = mpsc::channel();
        let ctx = Arc::new(Scripted {
            events: Mutex::new(VecDeque::new()),
            dropped: dtx,
        });
        let (tx, rx) = mpsc::channel::<HwEvent>();
        let m = Monitor::spawn("quiet", ctx, move |e| {
            let _ = tx.send(e);
        })
        .unwrap();
        m.join();
        drx.recv_timeout(Duration::from_secs(5)).expect("context closed");
        assert!(rx.try_recv().is_err());
    }
}
