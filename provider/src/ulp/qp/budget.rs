//! What a QP is created with through the layer, and the queue sizes that
//! follow from it: never clamped, refused with what the device can give.

use crate::verbs::{verr, Context, QpType, Result};

/// What to create a QP with through the layer ([`UlpQp::create`](super::UlpQp::create)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UlpQpInit {
    /// Transport (RC for read/write contexts).
    pub qp_type: QpType,
    /// Send WRs the application posts itself at once (each WR of each
    /// request it posts with [`UlpQp::post`](super::UlpQp::post)).
    pub send_wr: u32,
    /// Receive WRs the application posts at once.
    pub recv_wr: u32,
    /// Scatter/gather entries per send WR.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
    /// Read/write contexts ([`UlpQp::rw`](super::UlpQp::rw), [`UlpQp::expose`](super::UlpQp::expose)) in flight at
    /// once.
    pub rw_ctxs: u32,
    /// Local scatter entries of one read/write context at most.
    pub rw_max_sges: u32,
    /// Whether the read/write contexts may use fast registration (false
    /// where the backend has none: [`RwCaps::fast_reg`](crate::ulp::RwCaps)).
    pub rw_fast_reg: bool,
}

impl Default for UlpQpInit {
    fn default() -> Self {
        UlpQpInit {
            qp_type: QpType::Rc,
            send_wr: 64,
            recv_wr: 64,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
            rw_ctxs: 0,
            rw_max_sges: 1,
            rw_fast_reg: false,
        }
    }
}

/// The send-queue slots a QP created through the layer needs, and where
/// they go. No figure is ever clamped: if the device cannot give
/// `total`, creation fails and says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SqBudget {
    /// The application's own send WRs.
    pub app_wrs: u32,
    /// Read/write contexts in flight at once.
    pub rw_ctxs: u32,
    /// WRs one read/write context may take (the "MR factor"): a fast
    /// registration chain is REG_MR + op + LOCAL_INV (3); a plain one is
    /// one op WR per `max_send_sge` local entries.
    pub mr_factor: u32,
    /// The slot kept for the drain marker posted when the QP closes.
    pub drain: u32,
    /// Send queue depth asked of the device:
    /// `app_wrs + rw_ctxs × mr_factor + drain`.
    pub total: u32,
    /// Receive queue depth asked of the device (the application's
    /// receives + 1 drain marker).
    pub recv_total: u32,
}

impl SqBudget {
    /// The budget of `init` on the device behind `ctx`.
    ///
    /// # Errors
    ///
    /// `EINVAL` naming what the device can give if the send or receive
    /// queue, or the scatter/gather entries, exceed its limits.
    ///
    /// # Examples
    ///
    /// ```
    /// use softverbs::ulp::{SqBudget, UlpQpInit};
    /// let ctx = softverbs::soft::embedded_default()?[0].open()?;
    /// let init = UlpQpInit { send_wr: 16, rw_ctxs: 8, rw_max_sges: 8, max_send_sge: 4, rw_fast_reg: true, ..UlpQpInit::default() };
    /// let b = SqBudget::of(&ctx, &init)?;
    /// // 8 sges over 4-entry WRs: 2 plain WRs, but a fast-registration chain is 3.
    /// assert_eq!((b.mr_factor, b.total), (3, 16 + 8 * 3 + 1));
    /// let huge = UlpQpInit { send_wr: 1 << 30, ..init };
    /// assert!(SqBudget::of(&ctx, &huge).unwrap_err().to_string().contains("at most"));
    /// # Ok::<(), softverbs::verbs::Error>(())
    /// ```
    pub fn of(ctx: &Context, init: &UlpQpInit) -> Result<SqBudget> {
        let attr = ctx.query_device()?;
        let send_sge = init.max_send_sge.max(1);
        if send_sge > attr.max_sge || init.max_recv_sge > attr.max_sge {
            return Err(verr!(
                CreateQp,
                InvalidArgument,
                "{} send / {} receive scatter entries asked; the device gives at most {}",
                send_sge,
                init.max_recv_sge,
                attr.max_sge
            ));
        }
        // A READ's local entries are bounded by max_sge_rd too.
        let per_wr = send_sge.min(attr.max_sge_rd.max(1));
        let plain = init.rw_max_sges.max(1).div_ceil(per_wr);
        let mr_factor = if init.rw_ctxs == 0 {
            0
        } else if init.rw_fast_reg {
            plain.max(3)
        } else {
            plain
        };
        let ctx_slots = u64::from(init.rw_ctxs) * u64::from(mr_factor);
        let total = u64::from(init.send_wr) + ctx_slots + 1;
        if total > u64::from(attr.max_qp_wr) {
            return Err(verr!(
                CreateQp,
                InvalidArgument,
                "the send queue needs {total} WRs ({} application + {} contexts × {mr_factor} + 1 drain) but the device gives at most {}",
                init.send_wr,
                init.rw_ctxs,
                attr.max_qp_wr
            ));
        }
        let recv_total = u64::from(init.recv_wr) + 1;
        if recv_total > u64::from(attr.max_qp_wr) {
            return Err(verr!(
                CreateQp,
                InvalidArgument,
                "the receive queue needs {recv_total} WRs ({} application + 1 drain) but the device gives at most {}",
                init.recv_wr,
                attr.max_qp_wr
            ));
        }
        Ok(SqBudget {
            app_wrs: init.send_wr,
            rw_ctxs: init.rw_ctxs,
            mr_factor,
            drain: 1,
            total: total as u32,
            recv_total: recv_total as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device's limits are inclusive: asking exactly what it gives
    /// works, one more is refused by the budget itself (before the device
    /// is asked for a QP), naming the limit.
    #[test]
    fn the_device_limits_are_reached_and_not_passed() {
        let ctx = crate::soft::embedded_default().unwrap()[0].open().unwrap();
        let attr = ctx.query_device().unwrap();
        let base = UlpQpInit {
            send_wr: 4,
            recv_wr: 4,
            ..UlpQpInit::default()
        };
        let of = |init: UlpQpInit| SqBudget::of(&ctx, &init).map_err(|e| e.to_string());
        let (sge, wr) = (attr.max_sge, attr.max_qp_wr);
        // Which field, the most it may be, and what the refusal names.
        // The queues' last slot is the drain marker's.
        type Set = fn(&mut UlpQpInit, u32);
        let cases: [(Set, u32, &str); 4] = [
            (|i, v| i.max_send_sge = v, sge, "scatter entries"),
            (|i, v| i.max_recv_sge = v, sge, "scatter entries"),
            (|i, v| i.send_wr = v, wr - 1, "the send queue needs"),
            (|i, v| i.recv_wr = v, wr - 1, "the receive queue needs"),
        ];
        for (set, most, what) in cases {
            let (mut at, mut over) = (base, base);
            set(&mut at, most);
            set(&mut over, most + 1);
            of(at).unwrap_or_else(|e| panic!("{at:?}: {e}"));
            let e = of(over).unwrap_err();
            assert!(e.contains(what) && e.contains("at most"), "{e}");
        }
        let full = of(UlpQpInit {
            send_wr: wr - 1,
            recv_wr: wr - 1,
            ..base
        })
        .unwrap();
        assert_eq!((full.total, full.recv_total), (wr, wr));
    }
}
