//! A device's progress thread ends when the device goes, however the last
//! reference to it is dropped — also when the progress thread itself drops
//! it, on its way to sleep: the wake-up of that drop must not be lost with
//! the waker (a progress thread asleep without a deadline, with nothing left
//! to wake it, would stay forever with its poller).
//!
//! Its own test binary: it counts this process's progress threads.

mod udp_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use softverbs::soft::engine::EngineMode;
use softverbs::soft::link::inproc::InprocFabric;
use softverbs::soft::link::Link;
use softverbs::soft::{SoftDevice, SoftDeviceConfig};
use softverbs::verbs::*;
use udp_common::{connect, side};

/// Device names start with this, so their progress threads' names
/// (`softverbs-<device>`, cut to 15 bytes by the kernel) do too.
const PREFIX: &str = "px";

/// This process's threads whose name starts with `softverbs-px`.
fn progress_threads() -> usize {
    let want = format!("softverbs-{PREFIX}");
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|t| t.ok())
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .filter(|c| c.starts_with(&want))
                .count()
        })
        .unwrap_or(0)
}

fn device(name: &str, addr: &str, fabric: &Arc<InprocFabric>) -> Arc<SoftDevice> {
    SoftDevice::create(SoftDeviceConfig {
        link: Some(fabric.clone() as Arc<dyn Link>),
        // Spin 0: the thread goes to sleep right after each piece of work,
        // the path where it may hold the last reference.
        engine: EngineMode::ProgressThread { spin: Duration::ZERO },
        ..SoftDeviceConfig::new(name, addr.parse().unwrap())
    })
    .unwrap()
}

#[test]
fn progress_threads_end_when_their_devices_are_dropped_mid_traffic() {
    const ROUNDS: usize = 200;
    for i in 0..ROUNDS {
        let fabric = InprocFabric::new();
        let da = device(&format!("{PREFIX}{i}a"), "10.99.0.1", &fabric);
        let db = device(&format!("{PREFIX}{i}b"), "10.99.0.2", &fabric);
        let (a, b) = (side(&da, 4096, 100), side(&db, 4096, 900));
        connect(&a, &b, Mtu::Mtu1024);
        // Work for both threads at the moment the devices go.
        let sge = [b.mr.sge(0, 64).unwrap()];
        for k in 0..32 {
            b.qp.post_recv(&[RecvWr::new(k, &sge)]).unwrap();
        }
        let sge = [a.mr.sge(0, 64).unwrap()];
        for k in 0..32 {
            a.qp.post_send(&[SendWr::new(k, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
                .unwrap();
        }
        if i % 2 == 0 {
            da.unplug();
            db.unplug();
        } else {
            db.unplug();
            da.unplug();
        }
        drop((a, b, da, db));
    }
    // Every thread exits at once; allow a loaded machine plenty of time.
    let t0 = Instant::now();
    while progress_threads() > 0 && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        progress_threads(),
        0,
        "progress threads of {} dropped devices are still there",
        2 * ROUNDS
    );
}
