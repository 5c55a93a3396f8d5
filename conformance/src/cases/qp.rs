//! `qp.create.*` and `qp.modify.*`: QP creation limits, granted
//! capacities, and `modify_qp` rules outside the state table.

use softverbs::verbs::*;

use crate::case::{Cap, Case, Check, Env};
use crate::harness::*;
use crate::{ensure, ensure_eq};

pub(crate) fn register(out: &mut Vec<Case>) {
    for (t, caps) in [
        (QpType::Rc, &[][..]),
        (QpType::Uc, &[Cap::Uc][..]),
        (QpType::Ud, &[Cap::Ud][..]),
    ] {
        let name = t.name().to_lowercase();
        out.push(Case::new(
            format!("qp.create.{name}.granted_at_least_requested"),
            format!("a {t} QP is created in RESET with capacities at least those requested"),
            "ibv_create_qp(3) (the granted cap is at least the requested one)",
            caps,
            move |env: &Env| granted(env, t),
        ));
    }
    out.push(Case::new(
        "qp.create.max_send_wr_above_limit",
        "creating a QP with max_send_wr above the device's max_qp_wr fails with EINVAL",
        "ibv_create_qp(3); ibv_query_device(3) max_qp_wr",
        &[],
        |env: &Env| {
            let max = env.caps.device.max_qp_wr;
            ensure!(max < u32::MAX, "max_qp_wr is u32::MAX");
            try_create(
                env,
                QpCap {
                    max_send_wr: max + 1,
                    ..base_cap()
                },
                "max_send_wr = max_qp_wr + 1",
            )
        },
    ));
    out.push(Case::new(
        "qp.create.max_recv_wr_above_limit",
        "creating a QP with max_recv_wr above max_qp_wr fails with EINVAL",
        "ibv_create_qp(3); ibv_query_device(3) max_qp_wr",
        &[],
        |env: &Env| {
            let max = env.caps.device.max_qp_wr;
            ensure!(max < u32::MAX, "max_qp_wr is u32::MAX");
            try_create(
                env,
                QpCap {
                    max_recv_wr: max + 1,
                    ..base_cap()
                },
                "max_recv_wr = max_qp_wr + 1",
            )
        },
    ));
    out.push(Case::new(
        "qp.create.max_sge_above_limit",
        "creating a QP with max_send_sge above the device's max_sge fails with EINVAL",
        "ibv_create_qp(3); ibv_query_device(3) max_sge",
        &[],
        |env: &Env| {
            let max = env.caps.device.max_sge;
            try_create(
                env,
                QpCap {
                    max_send_sge: max + 1,
                    ..base_cap()
                },
                "max_send_sge = max_sge + 1",
            )
        },
    ));
    out.push(Case::new(
        "qp.create.inline_above_limit",
        "creating a QP with max_inline_data above the device's limit fails with EINVAL",
        "ibv_create_qp(3) (max_inline_data)",
        &[Cap::Inline],
        |env: &Env| {
            let max = env.caps.device.max_inline_data;
            if max == 0 {
                crate::skip!("the device does not report max_inline_data");
            }
            try_create(
                env,
                QpCap {
                    max_inline_data: max + 1,
                    ..base_cap()
                },
                "max_inline_data above the limit",
            )
        },
    ));
    out.push(Case::new(
        "qp.create.qpns_distinct",
        "QP numbers are 24-bit, never 0 or 1 (the special QPs), and distinct among live QPs",
        "IBTA 10.2.4 (QPN 0 and 1 are reserved); BTH DestQP is 24 bits",
        &[],
        |env: &Env| {
            let pd = env.a.alloc_pd()?;
            let cq = env.a.create_cq(8, 0, None, 0)?;
            let qps: Vec<Qp> = (0..32)
                .map(|_| create_qp(&pd, QpType::Rc, &cq, &cq, None, base_cap()))
                .collect::<Result<_>>()?;
            let mut n: Vec<u32> = qps.iter().map(Qp::qp_num).collect();
            for &q in &n {
                ensure!(q > 1 && q <= 0xff_ffff, "QPN {q:#x} out of range");
            }
            n.sort_unstable();
            n.dedup();
            ensure_eq!(n.len(), 32, "distinct QPNs");
            Ok(())
        },
    ));
    out.push(Case::new(
        "qp.create.cq_of_another_device_rejected",
        "creating a QP whose CQ belongs to another device fails",
        "ibv_create_qp(3) (CQs of the same context)",
        &[],
        |env: &Env| {
            if env.same_device() {
                crate::skip!("both sides are the same device");
            }
            let pd = env.a.alloc_pd()?;
            let cq = env.b.create_cq(8, 0, None, 0)?;
            ensure!(
                create_qp(&pd, QpType::Rc, &cq, &cq, None, base_cap()).is_err(),
                "a QP was created with a CQ of another device"
            );
            Ok(())
        },
    ));
    out.push(Case::new(
        "qp.query.reflects_modify",
        "query_qp after RESET->INIT->RTR->RTS reports the state and the attributes set on the way",
        "ibv_query_qp(3)",
        &[],
        |env: &Env| {
            let cfg = PairConfig::default();
            let p = Pair::new(&env.a, &env.b, cfg.clone())?;
            let a = p.a.qp.query()?;
            ensure_eq!(a.qp_state, QpState::Rts, "qp_state");
            ensure_eq!(a.port_num, 1, "port_num");
            ensure_eq!(a.dest_qp_num, p.b.qp.qp_num(), "dest_qp_num");
            ensure_eq!(a.path_mtu, cfg.mtu, "path_mtu");
            ensure_eq!(a.sq_psn, cfg.psn, "sq_psn (nothing sent yet)");
            ensure_eq!(a.rq_psn, p.b.psn, "rq_psn (nothing received yet)");
            ensure_eq!(a.timeout, cfg.timeout, "timeout");
            ensure_eq!(a.retry_cnt, cfg.retry_cnt, "retry_cnt");
            ensure_eq!(a.rnr_retry, cfg.rnr_retry, "rnr_retry");
            ensure_eq!(a.min_rnr_timer, cfg.min_rnr_timer, "min_rnr_timer");
            ensure_eq!(a.ah_attr.grh.dgid, p.b.gid, "ah_attr.grh.dgid");
            ensure_eq!(
                a.qp_access_flags & AccessFlags::REMOTE,
                cfg.qp_access & AccessFlags::REMOTE,
                "remote access"
            );
            Ok(())
        },
    ));
    out.push(Case::new(
        "qp.modify.psn_is_24_bits",
        "a PSN above 24 bits is stored masked to 24 bits",
        "BTH PSN is 24 bits (IBTA 9.2); kernel _ib_modify_qp masks sq_psn/rq_psn",
        &[],
        |env: &Env| {
            let cfg = PairConfig {
                psn: 0x0012_3456,
                ..PairConfig::default()
            };
            let p = Pair::unconnected(&env.a, &env.b, cfg.clone())?;
            p.a.to_init(&cfg)?;
            qp_to_rtr(&p.a.qp, &cfg, p.a.gid_index, p.b.gid, p.b.qp.qp_num(), 0x7f00_0001)?;
            qp_to_rts(&p.a.qp, &cfg, 0x0100_0002)?;
            let a = p.a.qp.query()?;
            ensure_eq!((a.rq_psn, a.sq_psn), (1, 2), "(rq_psn, sq_psn)");
            Ok(())
        },
    ));
    out.push(Case::new(
        "qp.modify.rts_attribute_only",
        "a modify without the STATE bit in RTS changes an allowed attribute (min_rnr_timer) and keeps the QP in RTS",
        "ibv_modify_qp(3); IBTA 11.2.4.2 (RTS->RTS optional attributes)",
        &[],
        |env: &Env| {
            let p = Pair::new(&env.a, &env.b, PairConfig::default())?;
            let a = QpAttr {
                min_rnr_timer: 20,
                ..QpAttr::default()
            };
            p.a.qp.modify(&a, QpAttrMask::MIN_RNR_TIMER)?;
            let q = p.a.qp.query()?;
            ensure_eq!(
                (q.qp_state, q.min_rnr_timer),
                (QpState::Rts, 20),
                "(state, min_rnr_timer)"
            );
            Ok(())
        },
    ));
    out.push(Case::new(
        "qp.modify.unknown_mask_bit",
        "a modify with an attribute-mask bit the ABI does not define fails and changes nothing",
        "uverbs modify_qp (unknown mask bits are rejected)",
        &[],
        |env: &Env| {
            let pd = env.a.alloc_pd()?;
            let cq = env.a.create_cq(8, 0, None, 0)?;
            let qp = create_qp(&pd, QpType::Rc, &cq, &cq, None, base_cap())?;
            let before = qp.query()?;
            let a = QpAttr {
                qp_state: QpState::Init,
                port_num: 1,
                ..QpAttr::default()
            };
            let mask = QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS
                | QpAttrMask::from_bits_retain(1 << 30);
            ensure!(qp.modify(&a, mask).is_err(), "a modify with mask bit 30 succeeded");
            ensure_eq!(qp.query()?, before, "attributes after the failed modify");
            Ok(())
        },
    ));
    out.push(Case::new(
        "qp.destroy.releases_cq",
        "after destroy_qp the CQs it used can be destroyed",
        "ibv_destroy_qp(3), ibv_destroy_cq(3)",
        &[],
        |env: &Env| {
            let pd = env.a.alloc_pd()?;
            let scq = env.a.create_cq(8, 0, None, 0)?;
            let rcq = env.a.create_cq(8, 0, None, 0)?;
            let qp = create_qp(&pd, QpType::Rc, &scq, &rcq, None, base_cap())?;
            qp.destroy()?;
            scq.destroy()?;
            rcq.destroy()?;
            pd.destroy()?;
            Ok(())
        },
    ));
}

fn base_cap() -> QpCap {
    QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

fn try_create(env: &Env, cap: QpCap, what: &str) -> Check {
    let pd = env.a.alloc_pd()?;
    let cq = env.a.create_cq(8, 0, None, 0)?;
    expect_err(
        create_qp(&pd, QpType::Rc, &cq, &cq, None, cap),
        ErrorKind::InvalidArgument,
        &format!("create_qp with {what}"),
    )
}

fn granted(env: &Env, t: QpType) -> Check {
    let pd = env.a.alloc_pd()?;
    let cq = env.a.create_cq(64, 0, None, 0)?;
    let want = QpCap {
        max_send_wr: 33,
        max_recv_wr: 17,
        max_send_sge: 2.min(env.caps.device.max_sge),
        max_recv_sge: 3.min(env.caps.device.max_sge),
        max_inline_data: if env.caps.has(Cap::Inline) { 32 } else { 0 },
    };
    let qp = create_qp(&pd, t, &cq, &cq, None, want)?;
    let got = qp.cap();
    ensure!(
        got.max_send_wr >= want.max_send_wr
            && got.max_recv_wr >= want.max_recv_wr
            && got.max_send_sge >= want.max_send_sge
            && got.max_recv_sge >= want.max_recv_sge
            && got.max_inline_data >= want.max_inline_data,
        "requested {want:?}, granted {got:?}"
    );
    ensure_eq!(qp.qp_type(), t, "QP type");
    expect_state(&qp, QpState::Reset, "a new QP")?;
    Ok(())
}
