//! Property test: CM ids under random connects, disconnects, destroys,
//! device removals, namespace moves, namespace deletions and address
//! removals. Whatever the order, every id bound to a device that goes away
//! gets exactly one DEVICE_REMOVAL, and every id bound through an address
//! removed from its device exactly one ADDR_CHANGE; no other id gets
//! either, destroying any id succeeds, and in the end only the listeners
//! are left.

mod cm_common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use cm_common::*;
use proptest::prelude::*;
use softverbs::cm::*;
use softverbs::subsystem::{AddressChange, Generation, NamespaceId};

#[derive(Debug, Clone)]
enum Op {
    /// Connect a client on device `a` to the wildcard listener via device `b`.
    Connect(usize, usize),
    /// Disconnect connection `k` (modulo the live ones).
    Disconnect(usize),
    /// Destroy both ids of connection `k`.
    Destroy(usize),
    /// Unplug device `i` and plug a new one with the same address.
    Replug(usize),
    /// Move device `i` to a fresh namespace and delete that namespace
    /// (the device comes back to the initial one: two removals).
    MoveAndDelete(usize),
    /// Report device `i`'s address removed from its interface.
    DropAddr(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3usize, 0..3usize).prop_map(|(a, b)| Op::Connect(a, b)),
        1 => (0..8usize).prop_map(Op::Disconnect),
        1 => (0..8usize).prop_map(Op::Destroy),
        1 => (0..3usize).prop_map(Op::Replug),
        1 => (0..3usize).prop_map(Op::MoveAndDelete),
        1 => (0..3usize).prop_map(Op::DropAddr),
    ]
}

struct Conn {
    c: CmId,
    _cr: Res,
    s: CmId,
    _sr: Res,
}

/// Runs `ops`; returns an error string on a broken property.
fn run(ops: &[Op]) -> std::result::Result<(), String> {
    let w = world(131, 0, fast_config());
    w.sub.set_removal_deadline(Duration::from_millis(100));
    let mut names = Vec::new();
    for host in 1..=3u8 {
        names.push(add_device(&w.sub, &w.fabric, 131, host, NamespaceId::INIT));
    }
    let sch = EventChannel::new().unwrap();
    let chans: std::cell::RefCell<Vec<EventChannel>> = std::cell::RefCell::new(Vec::new());
    let l = listener(&w.cm, &sch, PortSpace::Tcp, "0.0.0.0:9500".parse().unwrap());
    let mut conns: Vec<Conn> = Vec::new();
    let mut nowhere: Vec<(CmId, Res)> = Vec::new();
    // id -> device it is bound to; id -> removals expected / seen.
    let mut bound: HashMap<u64, (String, Generation)> = HashMap::new();
    let mut expected: HashMap<u64, u32> = HashMap::new();
    let mut seen: HashMap<u64, u32> = HashMap::new();
    // The same for ADDR_CHANGE, and the device instances whose address
    // was dropped.
    let mut addr_expected: HashMap<u64, u32> = HashMap::new();
    let addr_seen: std::cell::RefCell<HashMap<u64, u32>> = std::cell::RefCell::new(HashMap::new());
    let mut dropped: HashSet<(String, Generation)> = HashSet::new();
    let mut other: Vec<CmEvent> = Vec::new();
    let drain = |seen: &mut HashMap<u64, u32>, other: &mut Vec<CmEvent>| {
        let all: Vec<EventChannel> = std::iter::once(sch.clone())
            .chain(chans.borrow().iter().cloned())
            .collect();
        for chan in &all {
            while let Some(ev) = chan.try_get_event() {
                if ev.kind == CmEventKind::DeviceRemoval {
                    *seen.entry(ev.id).or_default() += 1;
                } else if ev.kind == CmEventKind::AddrChange {
                    *addr_seen.borrow_mut().entry(ev.id).or_default() += 1;
                } else {
                    other.push(ev);
                }
            }
        }
    };
    let remove_expect = |bound: &HashMap<u64, (String, Generation)>, expected: &mut HashMap<u64, u32>, name: &str| {
        let gen = w.sub.device(name).map(|d| d.generation()).ok();
        for (id, (n, g)) in bound {
            if n == name && Some(*g) == gen {
                *expected.entry(*id).or_default() += 1;
            }
        }
    };
    for op in ops {
        match op {
            Op::Connect(a, b) => {
                if a == b {
                    continue;
                }
                let (na, nb) = (*a as u8 + 1, *b as u8 + 1);
                let ch = EventChannel::new().unwrap();
                chans.borrow_mut().push(ch.clone());
                let c = w.cm.create_id(&ch, PortSpace::Tcp, 0).unwrap();
                if c.resolve_addr(Some(ip(131, na)), sa(131, nb, 9500)).is_err() {
                    continue; // the device is in another namespace right now
                }
                expect(&ch, CmEventKind::AddrResolved);
                c.resolve_route().unwrap();
                expect(&ch, CmEventKind::RouteResolved);
                let cr = with_qp(&c);
                c.connect(&ConnParam::default()).unwrap();
                let req = loop {
                    let Some(ev) = sch.get_event(Some(Duration::from_secs(5))).unwrap() else {
                        break None;
                    };
                    if ev.kind == CmEventKind::ConnectRequest {
                        break Some(ev);
                    }
                    if ev.kind == CmEventKind::DeviceRemoval {
                        *seen.entry(ev.id).or_default() += 1;
                    } else if ev.kind == CmEventKind::AddrChange {
                        *addr_seen.borrow_mut().entry(ev.id).or_default() += 1;
                    } else {
                        other.push(ev);
                    }
                };
                let Some(mut req) = req else {
                    // The server device is not in our namespace: the REQ
                    // went nowhere. Keep the client; it will time out.
                    bound.insert(c.id(), c.device().unwrap());
                    nowhere.push((c, cr));
                    continue;
                };
                let s = req.take_id().unwrap();
                let sr = with_qp(&s);
                s.accept(&ConnParam::default()).unwrap();
                bound.insert(c.id(), c.device().unwrap());
                bound.insert(s.id(), s.device().unwrap());
                conns.push(Conn { c, _cr: cr, s, _sr: sr });
            }
            Op::Disconnect(k) => {
                if !conns.is_empty() {
                    let k = k % conns.len();
                    let _ = conns[k].c.disconnect(); // may be any state: errors are fine
                }
            }
            Op::Destroy(k) => {
                if !conns.is_empty() {
                    let conn = conns.remove(k % conns.len());
                    bound.remove(&conn.c.id());
                    bound.remove(&conn.s.id());
                    drop(conn); // must not panic or hang, whatever the state
                }
            }
            Op::Replug(i) => {
                let name = names[*i].clone();
                if w.sub.device(&name).is_ok_and(|d| d.namespace() == NamespaceId::INIT) {
                    remove_expect(&bound, &mut expected, &name);
                    w.sub.remove_device(&name).map_err(|e| e.to_string())?;
                    names[*i] = add_device(&w.sub, &w.fabric, 131, *i as u8 + 1, NamespaceId::INIT);
                }
            }
            Op::MoveAndDelete(i) => {
                let name = names[*i].clone();
                let ns = w.sub.create_namespace(&unique("pns")).map_err(|e| e.to_string())?;
                remove_expect(&bound, &mut expected, &name);
                w.sub.move_device(&name, ns).map_err(|e| e.to_string())?;
                // Ids never follow a device: the generation changed.
                w.sub.delete_namespace(ns).map_err(|e| e.to_string())?;
            }
            Op::DropAddr(i) => {
                let name = names[*i].clone();
                let Ok(gen) = w.sub.device(&name).map(|d| d.generation()) else {
                    continue;
                };
                // Once per device instance: a repeated report changes nothing.
                if dropped.insert((name.clone(), gen)) {
                    for (id, (n, g)) in &bound {
                        if *n == name && *g == gen && seen.get(id).copied().unwrap_or(0) == 0 {
                            *addr_expected.entry(*id).or_default() += 1;
                        }
                    }
                }
                w.sub
                    .address_change(&name, ip(131, *i as u8 + 1), AddressChange::Removed)
                    .map_err(|e| e.to_string())?;
            }
        }
        drain(&mut seen, &mut other);
    }
    // Removal events are queued by the removing thread itself: all are in.
    drain(&mut seen, &mut other);
    for (id, n) in &seen {
        let want = expected.get(id).copied().unwrap_or(0).min(1);
        if *n != want {
            return Err(format!("id {id}: {n} DEVICE_REMOVAL events, expected {want}"));
        }
    }
    for (id, n) in &expected {
        if *n > 0 && seen.get(id).copied().unwrap_or(0) != 1 {
            return Err(format!("id {id}: no DEVICE_REMOVAL"));
        }
    }
    if *addr_seen.borrow() != addr_expected {
        return Err(format!(
            "ADDR_CHANGE per id: {:?}, expected {addr_expected:?}",
            addr_seen.borrow()
        ));
    }
    drop(conns);
    drop(nowhere);
    drop(other);
    // Destroyed ids linger only for time-wait (or the REQ/DREQ retries of
    // a peer that is gone).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while w.cm.id_count() > 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if w.cm.id_count() != 1 {
        return Err(format!("ids left: {:?}, expected only the listener", w.cm.id_states()));
    }
    drop(l);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn ids_survive_random_hotplug(ops in proptest::collection::vec(op(), 1..14)) {
        prop_assert_eq!(run(&ops), Ok(()));
    }
}
