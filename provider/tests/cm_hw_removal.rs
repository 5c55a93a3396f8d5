//! Hot unplug under hardware-backend CM ids (feature `hardware`): each id
//! bound to the device gets `DeviceRemoval` exactly once (the subsystem's
//! removal and librdmacm both report it), a wildcard listener sees
//! nothing, calls then fail with `DeviceRemoved`, destroying succeeds and
//! nothing is left in the CM.
//!
//! The unplug comes from softverbs' own libibverbs
//! (`SOFTVERBS_UNPLUG_AFTER_MS`, set here before the library starts):
//! with any other libibverbs (a real NIC) the test prints `SKIP: ...`, as
//! it does when no RDMA device is listed.
#![cfg(feature = "hardware")]

use std::net::SocketAddr;
use std::time::Duration;

use softverbs::cm::*;
use softverbs::subsystem::{NamespaceId, SubsystemConfig};

mod cm_hw_common;
use cm_hw_common::{hw_addr, hw_cm};

/// How long after the library starts it unplugs its device: long enough
/// for the ids below on a loaded machine.
const UNPLUG_MS: u64 = 6000;
const WAIT: Option<Duration> = Some(Duration::from_secs(60));

fn next(ch: &EventChannel) -> CmEvent {
    ch.get_event(WAIT).expect("get_event").expect("an event in time")
}

#[test]
fn hw_ids_get_one_removal() {
    if std::env::var_os("SOFTVERBS_CM_HW_ADDRS").is_none() {
        println!("SKIP hw_ids_get_one_removal: set SOFTVERBS_CM_HW_ADDRS to the address of softverbs' libibverbs device (this test unplugs it)");
        return;
    }
    std::env::set_var("SOFTVERBS_UNPLUG_AFTER_MS", UNPLUG_MS.to_string());
    let devs = match softverbs::hw::provider().devices() {
        Ok(d) if !d.is_empty() => d,
        other => {
            println!("SKIP hw_ids_get_one_removal: no RDMA device listed ({:?})", other.err());
            return;
        }
    };
    let name = devs[0].name().to_string();
    let ip = hw_addr().expect("checked above");
    let (_sub, gen, cm) = hw_cm(&name, SubsystemConfig::default());

    let lch = EventChannel::new().unwrap();
    let l = cm.create_id(&lch, PortSpace::Tcp, 1).unwrap();
    l.bind_addr(SocketAddr::new(ip, 0)).expect("bind");
    l.listen(4).expect("listen");
    let wch = EventChannel::new().unwrap();
    let w = cm.create_id(&wch, PortSpace::Tcp, 2).unwrap();
    w.bind_addr("0.0.0.0:0".parse().unwrap()).unwrap();
    w.listen(4).expect("wildcard listen (soft and librdmacm)");
    let ch = EventChannel::new().unwrap();
    let c = cm.create_id(&ch, PortSpace::Tcp, 3).unwrap();
    c.resolve_addr(Some(ip), l.local_addr().unwrap()).unwrap();
    assert_eq!(next(&ch).kind, CmEventKind::AddrResolved);

    for (id, chan) in [(&l, &lch), (&c, &ch)] {
        let ev = next(chan);
        assert_eq!(ev.kind, CmEventKind::DeviceRemoval, "{ev:?}");
        assert_eq!(ev.id, id.id());
        assert_eq!((ev.device.as_deref(), ev.generation), (Some(name.as_str()), Some(gen)));
        assert_eq!(ev.namespace, NamespaceId::INIT);
    }
    // Exactly once: neither the second reporter nor anything else adds
    // an event (bounded wait for nothing).
    for chan in [&lch, &ch, &wch] {
        let more = chan.get_event(Some(Duration::from_secs(2))).unwrap();
        assert!(more.is_none(), "{more:?}");
    }
    assert_eq!(c.resolve_route(), Err(Error::DeviceRemoved));
    assert_eq!(w.state(), "LISTEN");
    drop((l, c, w));
    assert_eq!(cm.id_count(), 0, "{:?}", cm.id_states());
}
