//! `srq.*`: shared receive queues: limits, sharing between QPs, the limit
//! event, and the last-WQE-reached event (docs/design.md §3.1; ibv_create_srq(3),
//! ibv_modify_srq(3)).

use softverbs::verbs::*;

use crate::case::{Cap, Case, Check, Env, Stop};
use crate::harness::*;
use crate::{ensure, ensure_eq, fail};

type R<T> = std::result::Result<T, Stop>;

const SRQ_CONTEXT: u64 = 0x5_4a_00;

fn srq_attr(max_wr: u32) -> SrqAttr {
    SrqAttr {
        max_wr,
        max_sge: 2,
        srq_limit: 0,
    }
}

/// A pair whose B side receives through an SRQ (`srq_wr` deep), plus a
/// second connected A/B QP pair sharing it when `two`.
struct Shared {
    p: Pair,
    srq: Srq,
    second: Option<(Qp, Qp)>,
}

impl Shared {
    fn new(env: &Env, srq_wr: u32, two: bool) -> R<Shared> {
        let cfg = PairConfig::default();
        let mut p = Pair::unconnected(&env.a, &env.b, cfg.clone())?;
        let srq = p.b.pd.create_srq(srq_attr(srq_wr), SRQ_CONTEXT)?;
        let qb = create_qp(&p.b.pd, QpType::Rc, &p.b.scq, &p.b.rcq, Some(&srq), cfg.cap)?;
        p.b.qp = qb;
        connect_qps(
            &cfg,
            (&p.a.qp, p.a.gid_index, p.a.gid),
            (&p.b.qp, p.b.gid_index, p.b.gid),
        )?;
        let second = match two {
            false => None,
            true => {
                let qa = create_qp(&p.a.pd, QpType::Rc, &p.a.scq, &p.a.rcq, None, cfg.cap)?;
                let qb = create_qp(&p.b.pd, QpType::Rc, &p.b.scq, &p.b.rcq, Some(&srq), cfg.cap)?;
                connect_qps(&cfg, (&qa, p.a.gid_index, p.a.gid), (&qb, p.b.gid_index, p.b.gid))?;
                Some((qa, qb))
            }
        };
        Ok(Shared { p, srq, second })
    }

    /// Posts `n` receives of 256 bytes to the SRQ, wr_ids `first..`.
    fn post(&self, first: u64, n: u64) -> Check {
        for i in first..first + n {
            let sge = [self.p.b.mr.sge((i % 64) * 256, 256)?];
            self.srq.post_recv(&[RecvWr::new(i, &sge)])?;
        }
        Ok(())
    }

    /// A send of 8 bytes from `qp` (an A-side QP), waited for.
    fn send_from(&self, qp: &Qp, id: u64) -> Check {
        self.p.a.mr.write(0, &id.to_le_bytes())?;
        let sge = [self.p.a.mr.sge(0, 8)?];
        qp.post_send(&[SendWr::new(id, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])?;
        let wc = expect_one(&self.p.a.scq, "send completion")?;
        check_wc(&wc, id, WcStatus::Success, Some(WcOpcode::Send), "send")
    }
}

pub(crate) fn register(out: &mut Vec<Case>) {
    out.push(Case::new(
        "srq.create.above_max_srq_wr",
        "creating an SRQ with max_wr above the device's max_srq_wr fails with EINVAL",
        "ibv_create_srq(3)",
        &[Cap::Srq],
        |env: &Env| {
            let pd = env.a.alloc_pd()?;
            let max = env.caps.device.max_srq_wr;
            expect_err(
                pd.create_srq(srq_attr(max.saturating_add(1)), 0),
                ErrorKind::InvalidArgument,
                "create_srq",
            )
        },
    ));
    out.push(Case::new(
        "srq.create.above_max_srq_sge",
        "creating an SRQ with max_sge above the device's max_srq_sge fails with EINVAL",
        "ibv_create_srq(3)",
        &[Cap::Srq],
        |env: &Env| {
            let pd = env.a.alloc_pd()?;
            let attr = SrqAttr {
                max_sge: env.caps.device.max_srq_sge.saturating_add(1),
                ..srq_attr(16)
            };
            expect_err(pd.create_srq(attr, 0), ErrorKind::InvalidArgument, "create_srq")
        },
    ));
    out.push(Case::new(
        "srq.create.granted",
        "a created SRQ reports at least the requested max_wr and max_sge, and no limit armed",
        "ibv_create_srq(3), ibv_query_srq(3)",
        &[Cap::Srq],
        |env: &Env| {
            let pd = env.a.alloc_pd()?;
            let srq = pd.create_srq(srq_attr(100), 1)?;
            let a = srq.query()?;
            ensure!(
                a.max_wr >= 100 && a.max_sge >= 2,
                "requested 100 WRs / 2 SGEs, got {a:?}"
            );
            ensure_eq!(a.srq_limit, 0, "srq_limit");
            Ok(())
        },
    ));
    out.push(Case::new(
        "srq.shared_by_two_qps",
        "two RC QPs on one SRQ both receive from it; each completion names the QP the message came in on",
        "IBTA 10.2.9 (shared receive queues); ibv_create_srq(3)",
        &[Cap::Srq],
        |env: &Env| {
            let s = Shared::new(env, 16, true)?;
            let (qa2, qb2) = s.second.as_ref().expect("two QPs");
            s.post(100, 4)?;
            s.send_from(&s.p.a.qp, 1)?;
            s.send_from(qa2, 2)?;
            s.send_from(&s.p.a.qp, 3)?;
            let wcs = expect_n(&s.p.b.rcq, 3, "receives from the SRQ")?;
            let got: Vec<(u64, u32)> = wcs.iter().map(|w| (w.wr_id, w.qp_num)).collect();
            let (q1, q2) = (s.p.b.qp.qp_num(), qb2.qp_num());
            ensure_eq!(
                got,
                vec![(100, q1), (101, q2), (102, q1)],
                "(wr_id, qp_num) of the receives"
            );
            for (i, wc) in wcs.iter().enumerate() {
                let slot = (wc.wr_id % 64) * 256;
                let v = u64::from_le_bytes(s.p.b.mr.to_vec(slot, 8)?.try_into().expect("8 bytes"));
                ensure_eq!(v, i as u64 + 1, "message in receive {}", wc.wr_id);
            }
            Ok(())
        },
    ));
    out.push(Case::new(
        "srq.qp_post_recv_rejected",
        "post_recv on a QP attached to an SRQ fails with EINVAL",
        "ibv_post_recv(3) (a QP with an SRQ has no receive queue of its own)",
        &[Cap::Srq],
        |env: &Env| {
            let s = Shared::new(env, 8, false)?;
            let sge = [s.p.b.mr.sge(0, 64)?];
            let r = s.p.b.qp.post_recv(&[RecvWr::new(1, &sge)]);
            ensure!(r.is_err(), "post_recv on a QP with an SRQ succeeded");
            Ok(())
        },
    ));
    out.push(Case::new(
        "srq.limit.event_fires_once",
        "with the limit armed at 2 and 4 receives posted, taking the third fires SRQ_LIMIT_REACHED once and disarms the limit",
        "ibv_modify_srq(3) (srq_limit); IBTA 10.2.9.4, 11.6.3.3",
        &[Cap::Srq],
        |env: &Env| {
            let s = Shared::new(env, 16, false)?;
            s.post(0, 4)?;
            s.srq.modify(&SrqAttr { srq_limit: 2, ..srq_attr(16) }, SrqAttrMask::LIMIT)?;
            s.send_from(&s.p.a.qp, 1)?;
            s.send_from(&s.p.a.qp, 2)?;
            expect_n(&s.p.b.rcq, 2, "receives")?;
            let early = wait_async(&env.b, QUIET, |e| e.event_type == EventType::SrqLimitReached)?;
            ensure!(early.is_none(), "SRQ_LIMIT_REACHED fired with 2 receives left (limit 2)");
            s.send_from(&s.p.a.qp, 3)?;
            expect_one(&s.p.b.rcq, "third receive")?;
            match wait_async(&env.b, WAIT, |e| e.event_type == EventType::SrqLimitReached)? {
                Some(e) => ensure_eq!(e.element, AsyncElement::Srq(SRQ_CONTEXT), "event element"),
                None => fail!("no SRQ_LIMIT_REACHED within {WAIT:?} after the count dropped below the limit"),
            }
            ensure_eq!(s.srq.query()?.srq_limit, 0, "srq_limit after the event (disarmed)");
            s.send_from(&s.p.a.qp, 4)?;
            expect_one(&s.p.b.rcq, "fourth receive")?;
            let again = wait_async(&env.b, QUIET, |e| e.event_type == EventType::SrqLimitReached)?;
            ensure!(again.is_none(), "SRQ_LIMIT_REACHED fired again without re-arming");
            Ok(())
        },
    ));
    out.push(Case::new(
        "srq.limit.above_max_wr",
        "arming a limit above the SRQ's max_wr fails with EINVAL and leaves the SRQ unchanged",
        "ibv_modify_srq(3)",
        &[Cap::Srq],
        |env: &Env| {
            let pd = env.a.alloc_pd()?;
            let srq = pd.create_srq(srq_attr(8), 0)?;
            let before = srq.query()?;
            let attr = SrqAttr {
                srq_limit: before.max_wr + 1,
                ..before
            };
            expect_err(
                srq.modify(&attr, SrqAttrMask::LIMIT),
                ErrorKind::InvalidArgument,
                "modify_srq",
            )?;
            ensure_eq!(srq.query()?, before, "SRQ attributes after the failed modify");
            Ok(())
        },
    ));
    out.push(Case::new(
        "srq.full",
        "posting max_wr + 1 receives to an SRQ fails with ENOMEM at index max_wr",
        "ibv_post_srq_recv(3); docs/design.md §3.3 (queue full: ENOMEM)",
        &[Cap::Srq],
        |env: &Env| {
            let pd = env.a.alloc_pd()?;
            let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
            let srq = pd.create_srq(srq_attr(8), 0)?;
            let n = srq.query()?.max_wr as usize;
            if n > 4096 {
                crate::skip!("the device granted {n} SRQ WRs for 8");
            }
            let sge = [mr.sge(0, 64)?];
            let wrs: Vec<RecvWr<'_>> = (0..n + 1).map(|i| RecvWr::new(i as u64, &sge)).collect();
            expect_post_err(srq.post_recv(&wrs), n, ErrorKind::NoMemory, "post_srq_recv")
        },
    ));
    out.push(Case::new(
        "srq.too_many_sges",
        "a receive with more SGEs than the SRQ's max_sge fails with EINVAL",
        "ibv_post_srq_recv(3)",
        &[Cap::Srq],
        |env: &Env| {
            let pd = env.a.alloc_pd()?;
            let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
            let srq = pd.create_srq(srq_attr(8), 0)?;
            let n = srq.query()?.max_sge as usize + 1;
            let sgl: Vec<Sge<'_>> = (0..n).map(|i| mr.sge(i as u64 * 16, 16)).collect::<Result<_>>()?;
            expect_post_err(
                srq.post_recv(&[RecvWr::new(1, &sgl)]),
                0,
                ErrorKind::InvalidArgument,
                "post_srq_recv",
            )
        },
    ));
    out.push(Case::new(
        "srq.destroy_busy",
        "destroying an SRQ that a QP uses fails with EBUSY",
        "docs/design.md §3.1 (destroying an SRQ still in use fails with EBUSY)",
        &[Cap::Srq],
        |env: &Env| {
            let s = Shared::new(env, 8, false)?;
            let Shared { p, srq, .. } = s;
            let srq = match srq.destroy() {
                Ok(()) => fail!("destroy_srq succeeded while a QP uses it"),
                Err(e) if e.error.kind() == ErrorKind::Busy => e.object,
                Err(e) => fail!("expected EBUSY, got {}", e.error),
            };
            drop(p);
            srq.destroy()?;
            Ok(())
        },
    ));
    out.push(Case::new(
        "srq.resize_grows",
        "modify_srq with MAX_WR grows the SRQ; the receives already posted stay usable",
        "ibv_modify_srq(3) (IBV_SRQ_MAX_WR with IBV_DEVICE_SRQ_RESIZE)",
        &[Cap::Srq, Cap::SrqResize],
        |env: &Env| {
            let s = Shared::new(env, 8, false)?;
            s.post(0, 2)?;
            s.srq.modify(&srq_attr(64), SrqAttrMask::MAX_WR)?;
            ensure!(
                s.srq.query()?.max_wr >= 64,
                "max_wr after resizing to 64: {:?}",
                s.srq.query()?
            );
            s.send_from(&s.p.a.qp, 1)?;
            let wc = expect_one(&s.p.b.rcq, "receive after the resize")?;
            check_wc(
                &wc,
                0,
                WcStatus::Success,
                Some(WcOpcode::Recv),
                "receive posted before the resize",
            )
        },
    ));
    out.push(Case::new(
        "srq.last_wqe_reached",
        "moving a QP attached to an SRQ to ERR raises QP_LAST_WQE_REACHED for that QP",
        "IBTA 11.6.3.1 (last WQE reached); ibv_get_async_event(3)",
        &[Cap::Srq],
        |env: &Env| {
            let s = Shared::new(env, 8, false)?;
            s.post(0, 2)?;
            s.p.b.move_to(QpState::Err)?;
            let qpn = s.p.b.qp.qp_num();
            let ev = wait_async(&env.b, WAIT, |e| e.event_type == EventType::QpLastWqeReached)?;
            match ev {
                Some(e) => ensure_eq!(e.element, AsyncElement::Qp(qpn), "event element"),
                None => fail!("no QP_LAST_WQE_REACHED within {WAIT:?}"),
            }
            // The SRQ's receives are not the QP's to flush.
            expect_quiet(&s.p.b.rcq, "the receive CQ (SRQ receives stay in the SRQ)")
        },
    ));
    register_more(out);
}

fn register_more(out: &mut Vec<Case>) {
    out.push(Case::new(
        "srq.empty_rnr_then_post",
        "an RC send to a QP whose SRQ is empty is RNR NAK'd (rnr_retry 7) and completes once the SRQ gets a receive",
        "IBTA 10.2.9 (an empty SRQ is a missing receive: RNR NAK); docs/design.md §3.4",
        &[Cap::Srq],
        |env: &Env| {
            let s = Shared::new(env, 8, false)?;
            let sge = [s.p.a.mr.sge(0, 8)?];
            s.p.a
                .qp
                .post_send(&[SendWr::new(1, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])?;
            expect_quiet(&s.p.a.scq, "a send waiting on an empty SRQ")?;
            s.post(40, 1)?;
            let wc = expect_one(&s.p.a.scq, "send completion")?;
            check_wc(&wc, 1, WcStatus::Success, Some(WcOpcode::Send), "send")?;
            let r = expect_one(&s.p.b.rcq, "receive from the SRQ")?;
            check_wc(&r, 40, WcStatus::Success, Some(WcOpcode::Recv), "receive")
        },
    ));
}
