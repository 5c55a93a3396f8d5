//! ADDR_CHANGE under hardware-backend CM ids (feature `hardware`): the
//! address of the library's device is reported removed
//! (`softverbs_remove_addr` of softverbs' own libibverbs, looked up with
//! `dlsym`); librdmacm delivers `RDMA_CM_EVENT_ADDR_CHANGE` to the id bound
//! through it, and the CM passes it on once, with namespace, device and
//! generation, to that id alone: a wildcard listener sees nothing.
//!
//! With any other libibverbs (a real NIC) the test prints `SKIP: ...`, as
//! it does when no RDMA device is listed or `SOFTVERBS_CM_HW_ADDRS` (the
//! device's address) is not set.
#![cfg(feature = "hardware")]

use std::ffi::{c_char, c_int, CString};
use std::net::SocketAddr;
use std::time::Duration;

use softverbs::cm::*;
use softverbs::subsystem::{NamespaceId, SubsystemConfig};

mod cm_hw_common;
use cm_hw_common::{hw_addr, hw_cm, loaded_symbol};

const WAIT: Option<Duration> = Some(Duration::from_secs(60));

type RemoveAddr = unsafe extern "C" fn(*const c_char, *const c_char) -> c_int;

#[test]
fn hw_addr_change_reaches_the_bound_id_once() {
    let Some(ip) = hw_addr() else {
        println!("SKIP hw_addr_change: set SOFTVERBS_CM_HW_ADDRS to the address of softverbs' libibverbs device");
        return;
    };
    let devs = match softverbs::hw::provider().devices() {
        Ok(d) if !d.is_empty() => d,
        other => {
            println!("SKIP hw_addr_change: no RDMA device listed ({:?})", other.err());
            return;
        }
    };
    // Loaded by now (the device list came from it).
    let Some(p) = loaded_symbol(c"softverbs_remove_addr") else {
        println!("SKIP hw_addr_change: the libibverbs loaded is not softverbs' (no softverbs_remove_addr)");
        return;
    };
    // SAFETY: softverbs' libibverbs exports it with this signature.
    let remove_addr: RemoveAddr = unsafe { std::mem::transmute::<*mut libc::c_void, RemoveAddr>(p) };
    let name = devs[0].name().to_string();
    let (_sub, gen, cm) = hw_cm(&name, SubsystemConfig::default());

    let wch = EventChannel::new().unwrap();
    let w = cm.create_id(&wch, PortSpace::Tcp, 1).unwrap();
    w.bind_addr("0.0.0.0:0".parse().unwrap()).unwrap();
    w.listen(4).expect("wildcard listen (soft and librdmacm)");
    let ch = EventChannel::new().unwrap();
    let c = cm.create_id(&ch, PortSpace::Tcp, 2).unwrap();
    c.resolve_addr(Some(ip), SocketAddr::new(ip, 7999)).unwrap();
    let ev = ch.get_event(WAIT).unwrap().expect("an event in time");
    assert_eq!(ev.kind, CmEventKind::AddrResolved, "{ev:?}");

    let (n, a) = (
        CString::new(name.clone()).unwrap(),
        CString::new(ip.to_string()).unwrap(),
    );
    // SAFETY: two NUL-terminated strings.
    assert_eq!(unsafe { remove_addr(n.as_ptr(), a.as_ptr()) }, 0);
    let ev = ch.get_event(WAIT).unwrap().expect("an event in time");
    assert_eq!(ev.kind, CmEventKind::AddrChange, "{ev:?}");
    assert_eq!(ev.id, c.id());
    assert_eq!((ev.device.as_deref(), ev.generation), (Some(name.as_str()), Some(gen)));
    assert_eq!(ev.namespace, NamespaceId::INIT);
    // SAFETY: as above; reported again, nothing new.
    assert_eq!(unsafe { remove_addr(n.as_ptr(), a.as_ptr()) }, 0);
    for chan in [&ch, &wch] {
        let more = chan.get_event(Some(Duration::from_secs(2))).unwrap();
        assert!(more.is_none(), "{more:?}");
    }
    drop((c, w));
}
