//! A ULP as a subsystem client: when the subsystem removes a device, the
//! client's `remove` upcall closes its layer QPs; every request in flight
//! (receives, sends waiting for a receiver) completes exactly once with
//! an error, before its callback's captures are dropped, and the removal
//! finds no straggling consumer.

mod ulp_common;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};

use softverbs::soft::SoftDeviceConfig;
use softverbs::subsystem::*;
use softverbs::ulp::{LocalBuf, UlpQpInit, UlpWr};
use softverbs::verbs::{WcStatus, WorkCompletion};
use ulp_common::{connect_one, End};

type Log = Arc<Mutex<Vec<(usize, Option<WcStatus>)>>>;

struct Probe(usize, Log);

impl Drop for Probe {
    fn drop(&mut self) {
        self.1.lock().unwrap().push((self.0, None));
    }
}

fn cb(id: usize, log: &Log) -> impl FnOnce(&WorkCompletion) + Send + 'static {
    let p = Probe(id, log.clone());
    move |wc| p.1.lock().unwrap().push((p.0, Some(wc.status)))
}

/// The ULP: its ends per device, dropped (QPs closed) on removal.
struct Ulp(Mutex<Vec<(String, End)>>);

impl Client for Ulp {
    fn add(&self, _d: &DeviceRef) -> softverbs::verbs::Result<()> {
        Ok(())
    }
    fn remove(&self, d: &DeviceRef, _why: RemovalReason) {
        let mine: Vec<End> = {
            let mut v = self.0.lock().unwrap();
            let (gone, keep) = std::mem::take(&mut *v).into_iter().partition(|(n, _)| n == d.name());
            *v = keep;
            gone.into_iter().map(|(_, e)| e).collect()
        };
        drop(mine);
    }
}

fn ends_of(sub: &Subsystem, name: &str) -> End {
    let ctx = sub.open(name, "ulp-test").unwrap();
    End::from_ctx(ctx, &UlpQpInit::default(), 512)
}

#[test]
fn removal_through_the_subsystem_completes_every_request_once() {
    let sub = Subsystem::new(SubsystemConfig::default());
    let pid = std::process::id() as u8;
    for (k, name) in ["ulp_sub_a", "ulp_sub_b"].iter().enumerate() {
        let cfg = SoftDeviceConfig::new(name, IpAddr::V4(Ipv4Addr::new(127, 171 + k as u8, pid, 1)));
        sub.add_device(SoftFactory::new(cfg), NamespaceId::INIT).unwrap();
    }
    let ulp = Arc::new(Ulp(Mutex::new(Vec::new())));
    sub.register_client("ulp", ClientScope::All, ulp.clone()).unwrap();
    let (a, b) = (ends_of(&sub, "ulp_sub_a"), ends_of(&sub, "ulp_sub_b"));
    connect_one(&a, &b, 4, 7);
    connect_one(&b, &a, 4, 7);
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let (abuf, bbuf) = (a.mr(4096), b.mr(4096));
    // On b: receives nobody fills, and sends a never receives (RNR
    // retried forever): all in flight when b goes.
    for i in 0..8 {
        b.qp()
            .post_recv(vec![LocalBuf::new(&bbuf, 0, 64).unwrap()], cb(i, &log))
            .unwrap();
    }
    for i in 8..12 {
        let wr = vec![UlpWr::send(vec![LocalBuf::new(&bbuf, 0, 8).unwrap()])];
        if i % 2 == 0 {
            b.qp().post(wr, cb(i, &log)).unwrap();
        } else {
            b.qp().post_unsignaled(wr, cb(i, &log)).unwrap();
        }
    }
    drop(abuf);
    drop(bbuf);
    ulp.0.lock().unwrap().push(("ulp_sub_a".into(), a));
    ulp.0.lock().unwrap().push(("ulp_sub_b".into(), b));
    let report = sub.remove_device("ulp_sub_b").unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.removed_clients, ["ulp"]);
    let log = log.lock().unwrap().clone();
    for i in 0..12 {
        let calls: Vec<_> = log.iter().filter(|(k, s)| *k == i && s.is_some()).collect();
        let drops = log.iter().filter(|(k, s)| *k == i && s.is_none()).count();
        assert_eq!((calls.len(), drops), (1, 1), "request {i}: {log:?}");
        assert_ne!(calls[0].1, Some(WcStatus::Success), "request {i}");
        let call_at = log.iter().position(|(k, s)| *k == i && s.is_some()).unwrap();
        let drop_at = log.iter().position(|(k, s)| *k == i && s.is_none()).unwrap();
        assert!(call_at < drop_at, "request {i}: called after its captures dropped");
    }
    sub.remove_device("ulp_sub_a").unwrap();
}
