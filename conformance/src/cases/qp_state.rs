//! `qp.state.*`: every transition of the `modify_qp` state table for RC, UC
//! and UD (docs/design.md §3.2), generated.
//!
//! The expectations come from [`spec`], a table written here from `docs/design.md`
//! §3.2 independently of the library's [`qp_state::transition`]; the case
//! `qp.state.table.matches_spec` checks that the two agree, and every other
//! case checks the backend against the spec:
//!
//! - `qp.state.<t>.<from>_to_<to>.required`: the transition succeeds with
//!   exactly the required mask and the QP then reports `<to>`;
//! - `….missing_<attr>`: leaving out one required attribute fails;
//! - `….extra_attr`: adding any one attribute outside the row fails;
//! - `qp.state.<t>.<from>_to_<to>.illegal`: a transition outside the table
//!   fails, with the STATE bit alone and with the attributes that would
//!   make sense for the target state.
//!
//! Every failing modify must change nothing: the QP's full `query_qp`
//! result is compared before and after.

use softverbs::verbs::qp_state;
use softverbs::verbs::*;

use crate::case::{Cap, Case, Check, Env, Stop};
use crate::harness::*;
use crate::{fail, skip};

type M = QpAttrMask;
type R<T> = std::result::Result<T, Stop>;

/// The states, in `verbs.h` order.
const STATES: [QpState; 7] = [
    QpState::Reset,
    QpState::Init,
    QpState::Rtr,
    QpState::Rts,
    QpState::Sqd,
    QpState::Sqe,
    QpState::Err,
];

/// The transports.
const TYPES: [QpType; 3] = [QpType::Rc, QpType::Uc, QpType::Ud];

/// docs/design.md §3.2, row by row: `(required, optional)` beside STATE for a legal
/// transition, `None` for an illegal one. Abbreviations of the design
/// table: PKEY = PKEY_INDEX, ACC = ACCESS_FLAGS, RNRT = MIN_RNR_TIMER,
/// DEST_RD = MAX_DEST_RD_ATOMIC, RD = MAX_QP_RD_ATOMIC, ALT = ALT_PATH,
/// MIG = PATH_MIG_STATE, CUR = CUR_STATE.
pub(crate) fn spec(t: QpType, from: QpState, to: QpState) -> Option<(M, M)> {
    use QpState::*;
    use QpType::*;
    let none = M::empty();
    let (pkey, port, qkey, acc) = (M::PKEY_INDEX, M::PORT, M::QKEY, M::ACCESS_FLAGS);
    let (alt, mig, cur, rnrt) = (M::ALT_PATH, M::PATH_MIG_STATE, M::CUR_STATE, M::MIN_RNR_TIMER);
    let (rd, dest_rd) = (M::MAX_QP_RD_ATOMIC, M::MAX_DEST_RD_ATOMIC);
    let row = |req: M, opt: M| Some((req, opt));
    match (from, to) {
        // "any→RESET, any→ERR: STATE only"; RESET→ERR is invalid.
        (Reset, Err) => None,
        (_, Reset) | (_, Err) => row(none, none),
        (Reset, Init) => match t {
            Ud => row(pkey | port | qkey, none),
            Uc | Rc => row(pkey | port | acc, none),
        },
        (Init, Init) => match t {
            Ud => row(none, pkey | port | qkey),
            Uc | Rc => row(none, pkey | port | acc),
        },
        (Init, Rtr) => {
            let connect = M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
            match t {
                Ud => row(none, pkey | qkey),
                Uc => row(connect, alt | acc | pkey),
                Rc => row(connect | dest_rd | rnrt, alt | acc | pkey),
            }
        }
        (Rtr, Rts) => match t {
            Ud => row(M::SQ_PSN, cur | qkey),
            Uc => row(M::SQ_PSN, cur | alt | acc | mig),
            Rc => row(
                M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | rd,
                cur | alt | acc | rnrt | mig,
            ),
        },
        (Rts, Rts) => match t {
            Ud => row(none, cur | qkey),
            Uc => row(none, cur | acc | alt | mig),
            Rc => row(none, cur | acc | alt | mig | rnrt),
        },
        (Rts, Sqd) => row(none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Rts) => match t {
            Ud => row(none, cur | qkey),
            Uc => row(none, cur | alt | acc | mig),
            Rc => row(none, cur | alt | acc | rnrt | mig),
        },
        (Sqd, Sqd) => match t {
            Ud => row(none, pkey | qkey),
            Uc => row(none, M::AV | alt | acc | pkey | mig),
            Rc => row(
                none,
                port | M::AV | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | rd | dest_rd | alt | acc | pkey | rnrt | mig,
            ),
        },
        // The design row gives RC "– / –": an RC QP never is in SQE (IBTA
        // 10.3.1: only UD and UC enter it), so for RC there is no such
        // transition to make.
        (Sqe, Rts) => match t {
            Ud => row(none, cur | qkey),
            Uc => row(none, cur | acc),
            Rc => None,
        },
        _ => None,
    }
}

/// Every attribute bit the ABI defines (STATE excluded).
fn all_attrs() -> M {
    M::all() - M::STATE
}

fn sname(s: QpState) -> &'static str {
    match s {
        QpState::Reset => "reset",
        QpState::Init => "init",
        QpState::Rtr => "rtr",
        QpState::Rts => "rts",
        QpState::Sqd => "sqd",
        QpState::Sqe => "sqe",
        QpState::Err => "err",
    }
}

fn tname(t: QpType) -> &'static str {
    match t {
        QpType::Rc => "rc",
        QpType::Uc => "uc",
        QpType::Ud => "ud",
    }
}

/// `av`, `path_mtu`, … for a single bit; `a|b` for several.
fn bits_name(m: M) -> String {
    let v: Vec<String> = m.iter_names().map(|(n, _)| n.to_lowercase()).collect();
    v.join("|")
}

fn requires(t: QpType) -> &'static [Cap] {
    match t {
        QpType::Rc => &[],
        QpType::Uc => &[Cap::Uc],
        QpType::Ud => &[Cap::Ud],
    }
}

pub(crate) fn register(out: &mut Vec<Case>) {
    out.push(Case::new(
        "qp.state.table.matches_spec",
        "the library's state table (qp_state::transition) equals the docs/design.md §3.2 table written in the suite",
        "docs/design.md §3.2; kernel qp_state_table",
        &[],
        |_env: &Env| {
            let mut diffs = Vec::new();
            for t in TYPES {
                for from in STATES {
                    for to in STATES {
                        let lib = qp_state::transition(t, from, to).map(|m| (m.required, m.optional));
                        let want = spec(t, from, to);
                        if lib != want {
                            diffs.push(format!("{t} {from}->{to}: library {lib:?}, spec {want:?}"));
                        }
                    }
                }
            }
            match diffs.is_empty() {
                true => Ok(()),
                false => fail!("{} difference(s): {}", diffs.len(), diffs.join("; ")),
            }
        },
    ));
    for t in TYPES {
        for from in STATES {
            for to in STATES {
                let base = format!("qp.state.{}.{}_to_{}", tname(t), sname(from), sname(to));
                let Some((req, opt)) = spec(t, from, to) else {
                    out.push(Case::new(
                        format!("{base}.illegal"),
                        format!("{t} {from}->{to} is not in the state table: it fails and changes nothing"),
                        "docs/design.md §3.2 (everything else is invalid); IBTA 11.2.4.2 (Modify QP)",
                        requires(t),
                        move |env: &Env| illegal(env, t, from, to),
                    ));
                    continue;
                };
                let rule = "docs/design.md §3.2; IBTA 11.2.4.2 (Modify QP); kernel ib_modify_qp_is_ok";
                let mask_text = match req.is_empty() {
                    true => "STATE".to_string(),
                    false => format!("STATE|{}", bits_name(req)),
                };
                out.push(Case::new(
                    format!("{base}.required"),
                    format!("{t} {from}->{to} with exactly {mask_text} succeeds and the QP reports {to}"),
                    rule,
                    requires(t),
                    move |env: &Env| legal(env, t, from, to, req),
                ));
                for bit in req.iter() {
                    out.push(Case::new(
                        format!("{base}.missing_{}", bits_name(bit)),
                        format!(
                            "{t} {from}->{to} without the required {} fails and changes nothing",
                            bits_name(bit).to_uppercase()
                        ),
                        rule,
                        requires(t),
                        move |env: &Env| missing(env, t, from, to, req, bit),
                    ));
                }
                out.push(Case::new(
                    format!("{base}.extra_attr"),
                    format!("{t} {from}->{to} with any one attribute outside the row fails and changes nothing"),
                    rule,
                    requires(t),
                    move |env: &Env| extra(env, t, from, to, req, opt),
                ));
            }
        }
    }
}

/// A lone QP (with its PD and CQ) for state-table cases, connected to
/// itself when it needs a peer.
struct Lone {
    pd: Pd,
    cq: Cq,
    qp: Qp,
    gid_index: u8,
    gid: Gid,
}

impl Lone {
    fn new(env: &Env, t: QpType) -> R<Lone> {
        let pd = env.a.alloc_pd()?;
        let cq = env.a.create_cq(16, 0, None, 0)?;
        let cap = QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = create_qp(&pd, t, &cq, &cq, None, cap)?;
        let (gid_index, gid) = first_gid(&env.a)?;
        Ok(Lone {
            pd,
            cq,
            qp,
            gid_index,
            gid,
        })
    }

    /// Valid values for every attribute of a `from`→`to` modify.
    fn attr(&self, from: QpState, to: QpState) -> QpAttr {
        let av = AhAttr::roce(self.gid, self.gid_index, 1);
        QpAttr {
            qp_state: to,
            cur_qp_state: from,
            path_mtu: Mtu::Mtu1024,
            path_mig_state: MigState::Migrated,
            qkey: 0x1111_1111,
            rq_psn: 0x10,
            sq_psn: 0x20,
            dest_qp_num: self.qp.qp_num(),
            qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            cap: self.qp.cap(),
            ah_attr: av,
            alt_ah_attr: av,
            pkey_index: 0,
            alt_pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            port_num: 1,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            alt_port_num: 1,
            alt_timeout: 14,
            rate_limit: 0,
        }
    }

    /// One step with the spec's required mask.
    fn step(&self, t: QpType, from: QpState, to: QpState) -> Check {
        let (req, _) = spec(t, from, to).expect("a path step is a legal transition");
        self.qp.modify(&self.attr(from, to), M::STATE | req).map_err(|e| {
            Stop::Fail(format!(
                "bringing the QP to {to} ({from}->{to} with its required mask): {e}"
            ))
        })
    }

    /// Brings the QP from RESET to `target` along the usual path.
    fn walk(&self, env: &Env, t: QpType, target: QpState) -> Check {
        use QpState::*;
        let path: &[QpState] = match target {
            Reset => &[],
            Init => &[Init],
            Rtr => &[Init, Rtr],
            Rts | Sqe => &[Init, Rtr, Rts],
            Sqd => &[Init, Rtr, Rts, Sqd],
            Err => &[Init, Err],
        };
        let mut cur = Reset;
        for &s in path {
            self.step(t, cur, s)?;
            cur = s;
        }
        if target == Sqe {
            self.enter_sqe(env, t)?;
        }
        Ok(())
    }

    /// Only the device moves a QP to SQE: after a send-queue error on a UD
    /// or UC QP (IBTA 10.3.1). Provoke one (a send whose SGE names an MR of
    /// another PD: a local protection error) and skip the case if the
    /// backend takes the QP elsewhere (ERR is what most devices do).
    fn enter_sqe(&self, env: &Env, t: QpType) -> Check {
        if t == QpType::Rc {
            skip!("an RC QP never enters SQE (IBTA 10.3.1: send errors on RC take the QP to ERR)");
        }
        let other = env.a.alloc_pd()?;
        let mr = other.alloc_mr(64, AccessFlags::LOCAL_WRITE)?;
        let sge = [mr.sge(0, 64)?];
        let ah;
        let mut wr = SendWr::new(1, SendOp::Send, &sge).flags(SendFlags::SIGNALED);
        if t == QpType::Ud {
            ah = self.pd.create_ah(&AhAttr::roce(self.gid, self.gid_index, 1))?;
            wr = wr.ud(&ah, self.qp.qp_num(), 0x1111_1111);
        }
        self.qp.post_send(&[wr])?;
        let wc = expect_one(&self.cq, "completion of the send with a foreign lkey")?;
        let state = self.qp.query()?.qp_state;
        if state != QpState::Sqe {
            skip!(
                "cannot reach SQE: after a send error (status '{}') the backend moved the {t} QP to {state} \
                 (only the device enters SQE)",
                wc.status
            );
        }
        Ok(())
    }
}

/// `modify` must fail with EINVAL and leave the QP exactly as it was.
fn must_fail(qp: &Qp, attr: &QpAttr, mask: M, what: &str) -> Check {
    let before = qp.query()?;
    match qp.modify(attr, mask) {
        Ok(()) => fail!("{what}: the modify succeeded (mask {})", bits_name(mask)),
        Err(e) if e.kind() == ErrorKind::InvalidArgument => {}
        Err(e) => fail!("{what}: expected EINVAL, got {}: {e}", errno_name(e.kind())),
    }
    let after = qp.query()?;
    if after != before {
        fail!(
            "{what}: the failed modify changed the QP: {}",
            diff(&before, &after).join(", ")
        );
    }
    Ok(())
}

/// Names and values of the fields that differ.
fn diff(a: &QpAttr, b: &QpAttr) -> Vec<String> {
    let mut v = Vec::new();
    macro_rules! cmp {
        ($($f:ident),+) => { $(if a.$f != b.$f { v.push(format!("{} {:?} -> {:?}", stringify!($f), a.$f, b.$f)); })+ };
    }
    cmp!(
        qp_state,
        cur_qp_state,
        path_mtu,
        path_mig_state,
        qkey,
        rq_psn,
        sq_psn,
        dest_qp_num,
        qp_access_flags,
        cap,
        ah_attr,
        alt_ah_attr,
        pkey_index,
        alt_pkey_index,
        en_sqd_async_notify,
        sq_draining,
        max_rd_atomic,
        max_dest_rd_atomic,
        min_rnr_timer,
        port_num,
        timeout,
        retry_cnt,
        rnr_retry,
        alt_port_num,
        alt_timeout,
        rate_limit
    );
    v
}

fn legal(env: &Env, t: QpType, from: QpState, to: QpState, req: M) -> Check {
    let l = Lone::new(env, t)?;
    l.walk(env, t, from)?;
    if let Err(e) = l.qp.modify(&l.attr(from, to), M::STATE | req) {
        fail!("{t} {from}->{to} with STATE|{} failed: {e}", bits_name(req));
    }
    expect_state(&l.qp, to, &format!("after {from}->{to}"))
}

fn missing(env: &Env, t: QpType, from: QpState, to: QpState, req: M, bit: M) -> Check {
    let l = Lone::new(env, t)?;
    l.walk(env, t, from)?;
    let what = format!("{t} {from}->{to} without {}", bits_name(bit));
    must_fail(&l.qp, &l.attr(from, to), M::STATE | (req - bit), &what)?;
    expect_state(&l.qp, from, &what)
}

fn extra(env: &Env, t: QpType, from: QpState, to: QpState, req: M, opt: M) -> Check {
    let l = Lone::new(env, t)?;
    l.walk(env, t, from)?;
    let attr = l.attr(from, to);
    for bit in (all_attrs() - req - opt).iter() {
        let what = format!("{t} {from}->{to} with the extra attribute {}", bits_name(bit));
        must_fail(&l.qp, &attr, M::STATE | req | bit, &what)?;
    }
    expect_state(&l.qp, from, "after the rejected modifies")?;
    // The row still works after all those failures.
    l.qp.modify(&attr, M::STATE | req).map_err(|e| {
        Stop::Fail(format!(
            "{from}->{to} with the required mask after the rejected ones: {e}"
        ))
    })?;
    expect_state(&l.qp, to, "after the legal modify")
}

/// The attributes of the usual transition into `to` (what a caller who
/// skipped a step would pass).
fn natural(t: QpType, to: QpState) -> M {
    let prev = match to {
        QpState::Init => QpState::Reset,
        QpState::Rtr => QpState::Init,
        QpState::Rts => QpState::Rtr,
        _ => return M::empty(),
    };
    spec(t, prev, to).map_or(M::empty(), |(r, _)| r)
}

fn illegal(env: &Env, t: QpType, from: QpState, to: QpState) -> Check {
    let l = Lone::new(env, t)?;
    l.walk(env, t, from)?;
    let attr = l.attr(from, to);
    let what = format!("{t} {from}->{to}");
    must_fail(&l.qp, &attr, M::STATE, &what)?;
    let nat = natural(t, to);
    if !nat.is_empty() {
        must_fail(&l.qp, &attr, M::STATE | nat, &format!("{what} with {}", bits_name(nat)))?;
    }
    expect_state(&l.qp, from, &what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_shape() {
        // Counts of legal transitions per type (SQE→RTS only for UD/UC).
        for (t, n) in [(QpType::Rc, 21), (QpType::Uc, 22), (QpType::Ud, 22)] {
            let legal = STATES
                .iter()
                .flat_map(|&f| STATES.iter().map(move |&to| (f, to)))
                .filter(|&(f, to)| spec(t, f, to).is_some())
                .count();
            assert_eq!(legal, n, "{t}");
        }
        assert_eq!(bits_name(M::AV | M::PATH_MTU), "av|path_mtu");
    }
}
