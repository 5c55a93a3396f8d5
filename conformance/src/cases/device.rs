//! `dev.*`: device, port, GID and P_Key queries and limits; `pd.*`:
//! protection domains.

use std::time::Duration;

use softverbs::verbs::*;

use crate::case::{Case, Check, Env};
use crate::harness::*;
use crate::{ensure, ensure_eq};

pub(crate) fn register(out: &mut Vec<Case>) {
    out.push(Case::new(
        "dev.query_device.limits",
        "query_device reports non-zero limits for every object the verbs need",
        "ibv_query_device(3)",
        &[],
        query_device_limits,
    ));
    out.push(Case::new(
        "dev.query_device.stable",
        "two query_device calls on two contexts of the same device agree",
        "ibv_query_device(3)",
        &[],
        |env: &Env| {
            let d1 = env.a.query_device()?;
            let other = env.a.query_device()?;
            ensure!(d1 == other, "two queries of {} differ", env.device_a);
            if env.same_device() {
                ensure!(d1 == env.b.query_device()?, "two contexts of {} disagree", env.device_a);
            }
            Ok(())
        },
    ));
    out.push(Case::new(
        "dev.query_device.guid_matches_device_list",
        "query_device's node_guid is the one the device list reports",
        "ibv_get_device_guid(3), ibv_query_device(3)",
        &[],
        |env: &Env| {
            let dev = devices(Some(env.backend))?
                .into_iter()
                .find(|d| d.name() == env.device_a);
            let Some(dev) = dev else {
                crate::fail!("{} is not in the {} device list", env.device_a, env.backend)
            };
            ensure_eq!(env.a.query_device()?.node_guid, dev.guid(), "node_guid");
            ensure_eq!(env.a.device_name(), env.device_a.as_str(), "context device name");
            Ok(())
        },
    ));
    out.push(Case::new(
        "dev.query_port.active",
        "port 1 is ACTIVE, active_mtu <= max_mtu, and the GID and P_Key tables are not empty",
        "ibv_query_port(3)",
        &[],
        |env: &Env| {
            let p = env.a.query_port(1)?;
            ensure_eq!(p.state, PortState::Active, "port 1 state");
            ensure!(
                p.active_mtu.bytes() <= p.max_mtu.bytes(),
                "active_mtu {} above max_mtu {}",
                p.active_mtu,
                p.max_mtu
            );
            ensure!(p.gid_tbl_len > 0, "gid_tbl_len is 0");
            ensure!(p.pkey_tbl_len > 0, "pkey_tbl_len is 0");
            ensure!(p.max_msg_sz >= 1 << 20, "max_msg_sz {} below 1 MiB", p.max_msg_sz);
            Ok(())
        },
    ));
    out.push(Case::new(
        "dev.query_port.port_0_invalid",
        "query_port(0) fails with EINVAL (ports are 1-based)",
        "ibv_query_port(3); IBTA 17.2.1 (port numbers start at 1)",
        &[],
        |env: &Env| expect_err(env.a.query_port(0), ErrorKind::InvalidArgument, "query_port(0)"),
    ));
    out.push(Case::new(
        "dev.query_port.beyond_last",
        "query_port(phys_port_cnt + 1) fails with EINVAL",
        "ibv_query_port(3)",
        &[],
        |env: &Env| {
            let n = env.caps.device.phys_port_cnt;
            expect_err(
                env.a.query_port(n + 1),
                ErrorKind::InvalidArgument,
                "query_port past the last",
            )
        },
    ));
    out.push(Case::new(
        "dev.query_gid.populated",
        "port 1 has a populated GID; on Ethernet it is a RoCE GID (IPv4-mapped or IPv6)",
        "ibv_query_gid(3); IBTA A17.4 (RoCEv2 GIDs)",
        &[],
        |env: &Env| {
            let (_, gid) = first_gid(&env.a)?;
            ensure!(!gid.is_zero(), "first GID is zero");
            if env.caps.port.link_layer == LinkLayer::Ethernet {
                // A RoCEv2 GID is an IP address: mapped IPv4 or a real IPv6
                // (never the unspecified address).
                ensure!(!gid.to_ip().is_unspecified(), "GID {gid} is not an address");
            }
            Ok(())
        },
    ));
    out.push(Case::new(
        "dev.query_gid.beyond_table",
        "query_gid at index gid_tbl_len fails",
        "ibv_query_gid(3)",
        &[],
        |env: &Env| {
            let len = env.caps.port.gid_tbl_len;
            ensure!(
                env.a.query_gid(1, len).is_err(),
                "query_gid(1, {len}) succeeded past the table"
            );
            Ok(())
        },
    ));
    out.push(Case::new(
        "dev.query_pkey.default",
        "P_Key index 0 holds the default full-membership P_Key 0xffff",
        "ibv_query_pkey(3); IBTA 10.9.1.1 (default P_Key)",
        &[],
        |env: &Env| {
            ensure_eq!(env.a.query_pkey(1, 0)?, 0xffff, "P_Key at index 0");
            Ok(())
        },
    ));
    out.push(Case::new(
        "dev.query_pkey.beyond_table",
        "query_pkey at index pkey_tbl_len fails",
        "ibv_query_pkey(3)",
        &[],
        |env: &Env| {
            let len = env.caps.port.pkey_tbl_len;
            ensure!(
                env.a.query_pkey(1, len).is_err(),
                "query_pkey(1, {len}) succeeded past the table"
            );
            Ok(())
        },
    ));
    out.push(Case::new(
        "dev.async_event.none_pending",
        "a fresh context has no async event pending (get_async_event with a zero timeout returns nothing)",
        "ibv_get_async_event(3)",
        &[],
        |env: &Env| {
            let e = env.a.get_async_event(Some(Duration::ZERO))?;
            ensure!(e.is_none(), "unexpected event {e:?}");
            Ok(())
        },
    ));
    out.push(Case::new(
        "dev.open.contexts_independent",
        "objects of two contexts of one device are independent: destroying one context's CQ leaves the other's",
        "ibv_open_device(3)",
        &[],
        |env: &Env| {
            let dev = devices(Some(env.backend))?
                .into_iter()
                .find(|d| d.name() == env.device_a);
            let Some(dev) = dev else {
                crate::fail!("{} is not in the device list", env.device_a)
            };
            let c2 = dev.open()?;
            let cq1 = env.a.create_cq(8, 1, None, 0)?;
            let cq2 = c2.create_cq(8, 2, None, 0)?;
            cq1.destroy()?;
            let mut wc = [WorkCompletion::default()];
            ensure_eq!(cq2.poll(&mut wc)?, 0, "poll of the other context's CQ");
            Ok(())
        },
    ));

    // ---- protection domains ---------------------------------------------
    out.push(Case::new(
        "pd.alloc_dealloc",
        "a PD can be allocated and deallocated, many times over",
        "ibv_alloc_pd(3)",
        &[],
        |env: &Env| {
            for _ in 0..32 {
                env.a.alloc_pd()?.destroy()?;
            }
            Ok(())
        },
    ));
    out.push(Case::new(
        "pd.many",
        "64 PDs can be live at once",
        "ibv_alloc_pd(3)",
        &[],
        |env: &Env| {
            let pds: Vec<Pd> = (0..64).map(|_| env.a.alloc_pd()).collect::<Result<_>>()?;
            ensure_eq!(pds.len(), 64, "live PDs");
            Ok(())
        },
    ));
    out.push(Case::new(
        "pd.dealloc_busy_with_mr",
        "deallocating a PD that still has an MR fails with EBUSY and the PD stays usable",
        "docs/design.md §3.1 (reference counting); ibv_alloc_pd(3)",
        &[],
        |env: &Env| {
            let pd = env.a.alloc_pd()?;
            let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
            let pd = match pd.destroy() {
                Ok(()) => crate::fail!("dealloc_pd succeeded with an MR registered"),
                Err(e) if e.error.kind() == ErrorKind::Busy => e.object,
                Err(e) => crate::fail!("expected EBUSY, got {}", e.error),
            };
            let _mr2 = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
            drop(mr);
            Ok(())
        },
    ));
    out.push(Case::new(
        "pd.dealloc_busy_with_qp",
        "deallocating a PD that still has a QP fails with EBUSY; after the QP is destroyed it succeeds",
        "docs/design.md §3.1 (reference counting); ibv_alloc_pd(3)",
        &[],
        |env: &Env| {
            let pd = env.a.alloc_pd()?;
            let cq = env.a.create_cq(8, 0, None, 0)?;
            let qp = create_qp(&pd, QpType::Rc, &cq, &cq, None, small_cap())?;
            let pd = match pd.destroy() {
                Ok(()) => crate::fail!("dealloc_pd succeeded with a QP alive"),
                Err(e) if e.error.kind() == ErrorKind::Busy => e.object,
                Err(e) => crate::fail!("expected EBUSY, got {}", e.error),
            };
            qp.destroy()?;
            pd.destroy()?;
            Ok(())
        },
    ));
}

fn query_device_limits(env: &Env) -> Check {
    let d = &env.caps.device;
    for (name, v) in [
        ("max_qp", d.max_qp),
        ("max_qp_wr", d.max_qp_wr),
        ("max_sge", d.max_sge),
        ("max_cq", d.max_cq),
        ("max_cqe", d.max_cqe),
        ("max_mr", d.max_mr),
        ("max_pd", d.max_pd),
    ] {
        ensure!(v > 0, "{name} is 0");
    }
    ensure!(d.phys_port_cnt >= 1, "phys_port_cnt is 0");
    ensure!(d.max_mr_size >= 1 << 20, "max_mr_size {} below 1 MiB", d.max_mr_size);
    ensure!(
        d.page_size_cap & 4096 != 0,
        "page_size_cap {:#x} lacks 4 KiB pages",
        d.page_size_cap
    );
    if !matches!(d.atomic_cap, None | Some(AtomicCap::None)) {
        ensure!(
            d.max_qp_rd_atom > 0 && d.max_qp_init_rd_atom > 0,
            "atomics supported but max_qp_rd_atom {} / max_qp_init_rd_atom {}",
            d.max_qp_rd_atom,
            d.max_qp_init_rd_atom
        );
    }
    Ok(())
}

/// A small QP capacity every device grants.
pub(crate) fn small_cap() -> QpCap {
    QpCap {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}
