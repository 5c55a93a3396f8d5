//! `hotplug.*` and `netns.*`: device removal in the middle of traffic and
//! namespace migration (docs/design.md §5), as property checks on devices the case
//! creates and removes itself. They need a backend whose devices can be
//! added and removed from user space: the soft provider. On hardware,
//! removing a device takes root and the kernel (`rdma dev set … netns`,
//! driver unbind), so the cases are not applicable there.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use softverbs::soft::SoftDeviceConfig;
use softverbs::subsystem::{
    Client, ClientScope, DeviceRef, NamespaceId, RemovalReason, SoftFactory, Subsystem, SubsystemConfig,
};
use softverbs::verbs::*;

use crate::case::{Case, Check, Env, Stop};
use crate::harness::*;
use crate::{ensure, ensure_eq, fail, skip};

type R<T> = std::result::Result<T, Stop>;

fn sub_err(e: softverbs::subsystem::Error) -> Stop {
    Stop::Fail(format!("subsystem: {e}"))
}

/// Two fresh soft devices registered in a private subsystem.
struct Rig {
    sub: Arc<Subsystem>,
    names: [String; 2],
}

impl Rig {
    fn new(env: &Env) -> R<Rig> {
        if env.backend != BackendKind::Soft {
            skip!("device removal is driven by the kernel on hardware (root, driver unbind): not from a case");
        }
        static NEXT: AtomicU32 = AtomicU32::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let sub = Arc::new(Subsystem::new(SubsystemConfig {
            removal_deadline: Duration::from_millis(20),
            ..SubsystemConfig::default()
        }));
        let mut names = [String::new(), String::new()];
        for (i, name) in names.iter_mut().enumerate() {
            *name = format!("conf_hp{}_{}", std::process::id() % 10_000 * 100 + n, i);
            let ip = IpAddr::V4(Ipv4Addr::new(127, 84, (n % 250) as u8 + 1, i as u8 + 1));
            sub.add_device(SoftFactory::new(SoftDeviceConfig::new(name, ip)), NamespaceId::INIT)
                .map_err(sub_err)?;
        }
        Ok(Rig { sub, names })
    }

    fn open(&self, i: usize) -> R<Context> {
        self.sub.open(&self.names[i], "conformance").map_err(sub_err)
    }

    fn remove(&self, i: usize) -> R<()> {
        self.sub.remove_device(&self.names[i]).map_err(sub_err)?;
        Ok(())
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = self.sub.remove_device(n);
        }
    }
}

/// Counts completions per wr_id and checks that each posted WR completed
/// exactly once.
#[derive(Default)]
struct Ledger {
    posted: Vec<u64>,
    seen: HashMap<u64, u32>,
}

impl Ledger {
    fn drain(&mut self, cq: &Cq, deadline: Duration) -> Check {
        let start = Instant::now();
        let mut wc = [WorkCompletion::default(); 32];
        while self.seen.values().sum::<u32>() < self.posted.len() as u32 {
            let n = match cq.poll(&mut wc) {
                Ok(n) => n,
                Err(e) => fail!("poll after removal failed: {e}"),
            };
            for w in &wc[..n] {
                ensure!(
                    matches!(w.status, WcStatus::Success | WcStatus::WrFlushErr),
                    "wr {} completed with {:?}, expected success or a flush",
                    w.wr_id,
                    w.status
                );
                *self.seen.entry(w.wr_id).or_default() += 1;
            }
            if start.elapsed() > deadline {
                fail!(
                    "{} of {} posted WRs completed within {deadline:?} after removal",
                    self.seen.values().sum::<u32>(),
                    self.posted.len()
                );
            }
        }
        for id in &self.posted {
            ensure_eq!(self.seen.get(id).copied().unwrap_or(0), 1, "completions of wr {id}");
        }
        ensure!(
            stays_empty(cq, Duration::from_millis(10))?,
            "a completion arrived for a WR never posted"
        );
        Ok(())
    }
}

fn removal_mid_traffic(env: &Env) -> Check {
    let rig = Rig::new(env)?;
    let (ca, cb) = (rig.open(0)?, rig.open(1)?);
    let cfg = PairConfig {
        cq_depth: 4096,
        cap: QpCap {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        ..PairConfig::default()
    };
    let p = Pair::new(&ca, &cb, cfg)?;
    let stop = AtomicBool::new(false);
    let ledger = Mutex::new(Ledger::default());
    std::thread::scope(|s| -> Check {
        // A thread posts signaled writes on A and polls, until A is gone.
        let poster = s.spawn(|| -> Check {
            let sge = [p.a.mr.sge(0, 64)?];
            let mut id = 0u64;
            let mut wc = [WorkCompletion::default(); 16];
            while !stop.load(Ordering::Acquire) {
                let wr = SendWr::new(
                    id,
                    SendOp::Write {
                        remote: p.b.mr.remote(0),
                    },
                    &sge,
                )
                .flags(SendFlags::SIGNALED);
                match p.a.qp.post_send(&[wr]) {
                    Ok(()) => ledger.lock().unwrap().posted.push(id),
                    Err(e) => ensure!(
                        matches!(e.error.kind(), ErrorKind::NoMemory | ErrorKind::NoDevice),
                        "post during removal failed with {}",
                        e.error
                    ),
                }
                id += 1;
                let n = p.a.scq.poll(&mut wc).unwrap_or(0);
                let mut l = ledger.lock().unwrap();
                for w in &wc[..n] {
                    *l.seen.entry(w.wr_id).or_default() += 1;
                }
            }
            Ok(())
        });
        std::thread::sleep(Duration::from_millis(5));
        rig.remove(0)?;
        std::thread::sleep(Duration::from_millis(2));
        stop.store(true, Ordering::Release);
        poster
            .join()
            .map_err(|_| Stop::Fail("the posting thread panicked".into()))??;
        Ok(())
    })?;
    let mut l = ledger.into_inner().unwrap();
    ensure!(!l.posted.is_empty(), "nothing was posted before the removal");
    l.drain(&p.a.scq, Duration::from_secs(5))?;
    // Control verbs fail with ENODEV; DEVICE_FATAL is the last async event.
    match ca.alloc_pd() {
        Err(e) => ensure_eq!(e.kind(), ErrorKind::NoDevice, "alloc_pd after removal"),
        Ok(_) => fail!("alloc_pd succeeded on a removed device"),
    }
    let mut last = None;
    while let Some(e) = ca.get_async_event(Some(Duration::ZERO))? {
        last = Some(e.event_type);
    }
    ensure_eq!(last, Some(EventType::DeviceFatal), "last async event");
    Ok(())
}

fn random_removal_points(env: &Env) -> Check {
    // A small deterministic property loop: for each seed, post a random mix
    // of receives and sends on both sides, remove one device at a random
    // point, and check exactly-once completion on every queue.
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for round in 0..12 {
        let rig = Rig::new(env)?;
        let (ca, cb) = (rig.open(0)?, rig.open(1)?);
        let cfg = PairConfig {
            cq_depth: 1024,
            ..PairConfig::default()
        };
        let p = Pair::new(&ca, &cb, cfg)?;
        let (mut la, mut lb_recv, mut la_recv) = (Ledger::default(), Ledger::default(), Ledger::default());
        let before = next() % 40;
        let victim = (next() % 2) as usize;
        for i in 0..before + 20 {
            if i == before {
                rig.remove(victim)?;
            }
            let sge = [p.a.mr.sge(0, 32)?];
            match next() % 3 {
                0 => {
                    if p.b.post_recv(1000 + i, 0, 64).is_ok() {
                        lb_recv.posted.push(1000 + i);
                    }
                }
                1 => {
                    if p.a.post_recv(2000 + i, 4096, 64).is_ok() {
                        la_recv.posted.push(2000 + i);
                    }
                }
                _ => {
                    let wr = SendWr::new(
                        i,
                        SendOp::Write {
                            remote: p.b.mr.remote(0),
                        },
                        &sge,
                    )
                    .flags(SendFlags::SIGNALED);
                    if p.a.qp.post_send(&[wr]).is_ok() {
                        la.posted.push(i);
                    }
                }
            }
        }
        // The surviving side's requests to a vanished peer end with retry
        // exhaustion, not a flush: accept that status there.
        if victim == 0 {
            la.drain(&p.a.scq, Duration::from_secs(5))
                .map_err(|e| Stop::Fail(format!("round {round}, A's sends: {e}")))?;
            la_recv
                .drain(&p.a.rcq, Duration::from_secs(5))
                .map_err(|e| Stop::Fail(format!("round {round}, A's receives: {e}")))?;
        } else {
            lb_recv
                .drain(&p.b.rcq, Duration::from_secs(5))
                .map_err(|e| Stop::Fail(format!("round {round}, B's receives: {e}")))?;
        }
    }
    Ok(())
}

/// One upcall: `(is_add, device, namespace, generation, removal reason)`.
type Upcall = (bool, String, NamespaceId, u64, Option<RemovalReason>);

/// Records upcalls.
#[derive(Default)]
struct Log(Mutex<Vec<Upcall>>);

impl Client for Log {
    fn add(&self, d: &DeviceRef) -> Result<()> {
        self.0
            .lock()
            .unwrap()
            .push((true, d.name().to_string(), d.namespace(), d.generation().as_u64(), None));
        Ok(())
    }

    fn remove(&self, d: &DeviceRef, why: RemovalReason) {
        self.0.lock().unwrap().push((
            false,
            d.name().to_string(),
            d.namespace(),
            d.generation().as_u64(),
            Some(why),
        ));
    }
}

fn netns_move(env: &Env) -> Check {
    let rig = Rig::new(env)?;
    let name = rig.names[0].clone();
    let blue = rig.sub.create_namespace("conf_blue").map_err(sub_err)?;
    let init_log = Arc::new(Log::default());
    let blue_log = Arc::new(Log::default());
    rig.sub
        .register_client("init", ClientScope::Namespace(NamespaceId::INIT), init_log.clone())
        .map_err(sub_err)?;
    rig.sub
        .register_client("blue", ClientScope::Namespace(blue), blue_log.clone())
        .map_err(sub_err)?;
    let gen_before = rig.sub.device(&name).map_err(sub_err)?.generation().as_u64();
    let (_report, moved) = rig.sub.move_device(&name, blue).map_err(sub_err)?;
    ensure_eq!(moved.namespace, blue, "namespace after the move");
    let gen_after = rig.sub.device(&name).map_err(sub_err)?.generation().as_u64();
    ensure!(gen_after != gen_before, "the generation did not change on the replug");
    let init_events: Vec<_> = init_log
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.1 == name)
        .cloned()
        .collect();
    let last = init_events.last().cloned();
    ensure!(
        matches!(last, Some((false, _, ns, g, Some(RemovalReason::NetnsMove { .. }))) if ns == NamespaceId::INIT && g == gen_before),
        "the initial namespace's client got {last:?}, expected a NetnsMove removal of generation {gen_before}"
    );
    let blue_events: Vec<_> = blue_log
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.1 == name)
        .cloned()
        .collect();
    ensure!(
        matches!(blue_events.as_slice(), [(true, _, ns, g, None)] if *ns == blue && *g == gen_after),
        "the blue namespace's client got {blue_events:?}, expected one add of generation {gen_after}"
    );
    // Deleting the namespace returns the device to the initial one.
    rig.sub.delete_namespace(blue).map_err(sub_err)?;
    ensure_eq!(
        rig.sub.device(&name).map_err(sub_err)?.namespace(),
        NamespaceId::INIT,
        "namespace after deleting blue"
    );
    Ok(())
}

/// Registers the cases.
pub(crate) fn register(out: &mut Vec<Case>) {
    out.push(Case::new(
        "hotplug.removal_mid_traffic.exactly_once",
        "a device removed while another thread posts and polls: every posted WR completes once (success or flush), control verbs ENODEV, DEVICE_FATAL last",
        "docs/design.md §5",
        &[],
        removal_mid_traffic,
    ));
    out.push(Case::new(
        "hotplug.random_removal_points.exactly_once",
        "12 seeded programs of receives and writes, a device removed at a random point: every WR of the removed side completes exactly once",
        "docs/design.md §5; docs/design.md §3.4 (flush)",
        &[],
        random_removal_points,
    ));
    out.push(Case::new(
        "netns.move.unplug_then_replug",
        "moving a device between namespaces is a NetnsMove removal in the old namespace and an add of a new generation in the new one; deleting the namespace brings it back",
        "docs/design.md §5",
        &[],
        netns_move,
    ));
}
