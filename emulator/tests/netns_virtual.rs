//! The virtual namespace driver: interfaces carry their devices between
//! namespaces, each namespace is an isolated network, deleting a namespace
//! brings interfaces and devices home, and shared mode keeps devices put.

use std::sync::Arc;
use std::time::{Duration, Instant};

use softverbs::subsystem::{ClientScope, NamespaceId, NetnsMode, Subsystem, SubsystemConfig};
use softverbs::verbs::*;
use softverbs_emulator::netns::traffic::{connect_rc, first_gid};
use softverbs_emulator::netns::{default_driver, NetnsDriver, VirtualNetns, INIT_NETNS};

fn setup() -> (Arc<Subsystem>, VirtualNetns) {
    let sub = Arc::new(Subsystem::new(SubsystemConfig {
        removal_deadline: Duration::from_millis(200),
        ..SubsystemConfig::default()
    }));
    let drv = VirtualNetns::new(sub.clone());
    drv.add_link("eth0", "10.65.0.1".parse().unwrap()).unwrap();
    drv.add_link("eth1", "10.65.0.2".parse().unwrap()).unwrap();
    (sub, drv)
}

/// A QP on each device, connected; a signaled send from `a` to `b`.
/// Returns the send's status, or `None` if it did not complete in time.
fn send_between(sub: &Subsystem, a: &str, b: &str) -> Option<WcStatus> {
    let (ca, cb) = (sub.open(a, "test").unwrap(), sub.open(b, "test").unwrap());
    let side = |ctx: &Context| {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, 0, None, 0).unwrap();
        let qp = pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 4,
                    max_recv_wr: 4,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 64,
                },
                sq_sig_all: false,
            })
            .unwrap();
        let mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        (qp, cq, mr, pd)
    };
    let (qa, cqa, mra, _pda) = side(&ca);
    let (qb, _cqb, mrb, _pdb) = side(&cb);
    connect_rc(&qa, first_gid(&cb).unwrap(), qb.qp_num(), 1, 2).unwrap();
    connect_rc(&qb, first_gid(&ca).unwrap(), qa.qp_num(), 2, 1).unwrap();
    qb.post_recv(&[RecvWr::new(1, &[mrb.sge(0, 64).unwrap()])]).unwrap();
    let sge = [mra.sge(0, 64).unwrap()];
    qa.post_send(&[SendWr::new(7, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
        .unwrap();
    let mut wc = [WorkCompletion::default(); 1];
    let end = Instant::now() + Duration::from_millis(50);
    while Instant::now() < end {
        if cqa.poll(&mut wc).unwrap() == 1 {
            return Some(wc[0].status);
        }
    }
    None
}

#[test]
fn devices_follow_their_interfaces_and_namespaces_are_isolated_networks() {
    let (sub, drv) = setup();
    assert_eq!(drv.kind(), "virtual");
    drv.add_device("vn_dev0", "eth0").unwrap();
    drv.add_device("vn_dev1", "eth1").unwrap();
    assert_eq!(drv.device_link("vn_dev1").as_deref(), Some("eth1"));
    assert_eq!(send_between(&sub, "vn_dev0", "vn_dev1"), Some(WcStatus::Success));

    let blue = drv.add_netns("blue").unwrap();
    let before = sub.device("vn_dev1").unwrap().generation();
    drv.link_set_netns("eth1", "blue").unwrap();
    assert_eq!(drv.link_netns("eth1"), Some(blue));
    let moved = sub.device("vn_dev1").unwrap();
    assert_eq!(moved.namespace(), blue);
    assert!(moved.generation() > before);
    assert_eq!(sub.devices(ClientScope::Namespace(blue)).len(), 1);
    assert_eq!(sub.devices(ClientScope::Namespace(NamespaceId::INIT)).len(), 1);
    // Different namespaces: no route between them.
    let unroutable = drv.fabric(NamespaceId::INIT).unroutable();
    assert_eq!(send_between(&sub, "vn_dev0", "vn_dev1"), None);
    assert!(drv.fabric(NamespaceId::INIT).unroutable() > unroutable);
    // Same namespace again: traffic flows.
    drv.link_set_netns("eth0", "blue").unwrap();
    assert_eq!(send_between(&sub, "vn_dev0", "vn_dev1"), Some(WcStatus::Success));
    // Moving to where it is changes nothing.
    let g = sub.device("vn_dev0").unwrap().generation();
    drv.link_set_netns("eth0", "blue").unwrap();
    assert_eq!(sub.device("vn_dev0").unwrap().generation(), g);

    // Deleting the namespace brings interfaces and devices home.
    drv.del_netns("blue").unwrap();
    assert_eq!(drv.netns("blue"), None);
    assert_eq!(drv.link_netns("eth0"), Some(NamespaceId::INIT));
    assert_eq!(sub.devices(ClientScope::Namespace(NamespaceId::INIT)).len(), 2);
    assert_eq!(send_between(&sub, "vn_dev0", "vn_dev1"), Some(WcStatus::Success));
    drv.del_device("vn_dev0").unwrap();
    drv.del_device("vn_dev1").unwrap();
    assert!(sub.devices(ClientScope::All).is_empty());
}

#[test]
fn shared_mode_moves_interfaces_but_not_devices() {
    let (sub, drv) = setup();
    drv.set_mode(NetnsMode::Shared).unwrap();
    let red = drv.add_netns("red").unwrap();
    drv.link_set_netns("eth0", "red").unwrap();
    // A device made on an interface in "red" still belongs to the initial
    // namespace, and is visible from "red".
    let info = drv.add_device("vn_sh0", "eth0").unwrap();
    assert_eq!(info.namespace, NamespaceId::INIT);
    drv.link_set_netns("eth0", INIT_NETNS).unwrap();
    drv.link_set_netns("eth0", "red").unwrap();
    assert_eq!(sub.device("vn_sh0").unwrap().generation(), info.generation);
    assert_eq!(sub.devices(ClientScope::Namespace(red)).len(), 1);
    assert_eq!(drv.set_mode(NetnsMode::Exclusive).unwrap_err().kind(), ErrorKind::Busy);
    drv.del_netns("red").unwrap();
    drv.set_mode(NetnsMode::Exclusive).unwrap();
    sub.shutdown();
}

#[test]
fn driver_errors() {
    let drv: Box<dyn NetnsDriver> = default_driver(Arc::new(Subsystem::new(SubsystemConfig::default())));
    assert_eq!(drv.kind(), "virtual");
    drv.add_link("eth0", "10.65.1.1".parse().unwrap()).unwrap();
    let kind = |r: softverbs::subsystem::Result<()>| r.unwrap_err().kind();
    assert_eq!(
        kind(drv.add_link("eth0", "10.65.1.2".parse().unwrap())),
        ErrorKind::Busy
    );
    assert_eq!(
        kind(drv.add_link("eth9", "10.65.1.1".parse().unwrap())),
        ErrorKind::Busy
    );
    assert_eq!(kind(drv.link_set_netns("eth9", INIT_NETNS)), ErrorKind::NotFound);
    assert_eq!(kind(drv.link_set_netns("eth0", "nowhere")), ErrorKind::NotFound);
    assert_eq!(kind(drv.del_netns(INIT_NETNS)), ErrorKind::PermissionDenied);
    assert_eq!(kind(drv.del_netns("nowhere")), ErrorKind::NotFound);
    drv.add_netns("x").unwrap();
    assert_eq!(drv.add_netns("x").unwrap_err().kind(), ErrorKind::Busy);
    assert_eq!(
        drv.add_device("vn_err0", "eth9").unwrap_err().kind(),
        ErrorKind::NotFound
    );
    drv.add_device("vn_err0", "eth0").unwrap();
    assert_eq!(drv.add_device("vn_err1", "eth0").unwrap_err().kind(), ErrorKind::Busy);
    assert_eq!(drv.sync().unwrap(), 0);
    drv.del_device("vn_err0").unwrap();
    assert_eq!(drv.del_device("vn_err0").unwrap_err().kind(), ErrorKind::NotFound);
}
