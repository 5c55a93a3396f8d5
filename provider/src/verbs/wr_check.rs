//! The rules a send work request must keep on every backend, checked at
//! post time (docs/design.md §3.3): the operation is one the QP's
//! transport has, the scatter list fits the QP, inline data only where
//! the operation carries a payload and within the QP's inline room, an
//! atomic's shape, the message length, and a UD destination.
//!
//! Both backends run [`check_send_wr`] before anything of the WR is
//! queued (soft) or handed to the provider (hw), so that a WR breaking one
//! of these rules is refused with `EINVAL` at its index, the same way on
//! both. What only one backend can know (the soft QP's state and queue
//! room, a REG_MR on hardware) stays with that backend.

use super::{Error, ErrorKind, QpType, SendFlags, SendOp, SendWr, Sge, Verb};

/// What the rules need to know of the QP a send WR is posted to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendLimits {
    /// The QP's transport.
    pub(crate) qp_type: QpType,
    /// Granted scatter length.
    pub(crate) max_send_sge: u32,
    /// Granted inline room.
    pub(crate) max_inline_data: u32,
    /// The port's longest message, where the backend checks it (the
    /// hardware backend leaves it to the device).
    pub(crate) max_msg_sz: Option<u32>,
}

/// A rule of [`check_send_wr`] that a send WR breaks.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SendWrFault<'a> {
    /// The operation does not exist on the QP's transport.
    OpNotForQpType(SendOp<'a>, QpType),
    /// More scatter/gather entries than `max_send_sge`.
    TooManySges(usize, u32),
    /// The entries add up to more than 2^32-1 bytes.
    LengthOverflow,
    /// INLINE on an operation that carries no payload (only sends and
    /// RDMA writes do).
    InlineNotForOp,
    /// More inline bytes than `max_inline_data`.
    InlineTooLong(u32, u32),
    /// An entry made with [`Sge::inline`] (it has no lkey) without INLINE.
    InlineSgeWithoutInline,
    /// An atomic without an 8-byte aligned remote address and one local
    /// entry of at least 8 bytes.
    AtomicShape,
    /// A message longer than the port's `max_msg_sz`.
    TooLong,
    /// A UD send without a destination.
    UdNoDestination,
}

impl SendWrFault<'_> {
    /// The error `ibv_post_send` reports (`EINVAL`, for each).
    #[cold]
    pub(crate) fn error(self) -> Error {
        let detail: String = match self {
            SendWrFault::OpNotForQpType(op, ty) => format!("{op:?} is not valid on a {ty} QP"),
            SendWrFault::TooManySges(n, max) => format!("{n} SGEs exceed max_send_sge {max}"),
            SendWrFault::LengthOverflow => "message longer than 2^32-1 bytes".into(),
            SendWrFault::InlineNotForOp => "INLINE is only valid for sends and RDMA writes".into(),
            SendWrFault::InlineTooLong(len, max) => {
                format!("inline data of {len} bytes exceeds max_inline_data {max}")
            }
            SendWrFault::InlineSgeWithoutInline => "an SGE made with Sge::inline needs SendFlags::INLINE".into(),
            SendWrFault::AtomicShape => {
                "atomics need an 8-byte aligned remote address and one local SGE of at least 8 bytes".into()
            }
            SendWrFault::TooLong => "message longer than max_msg_sz".into(),
            SendWrFault::UdNoDestination => "a UD send needs a destination (ah, remote_qpn, remote_qkey)".into(),
        };
        Error::new(Verb::PostSend, ErrorKind::InvalidArgument, detail)
    }
}

/// Whether the operation may carry inline data: sends and RDMA writes.
#[inline]
pub(crate) fn carries_inline(op: &SendOp<'_>) -> bool {
    matches!(
        op,
        SendOp::Send
            | SendOp::SendWithImm { .. }
            | SendOp::SendWithInv { .. }
            | SendOp::Write { .. }
            | SendOp::WriteWithImm { .. }
    )
}

/// Checks `wr` against the rules every backend keeps (the module docs),
/// in the order their faults are reported; the message's length in bytes.
///
/// # Errors
///
/// The first rule `wr` breaks.
#[inline]
pub(crate) fn check_send_wr<'a>(wr: &SendWr<'a>, qp: &SendLimits) -> Result<u32, SendWrFault<'a>> {
    if !wr.op.is_valid_for(qp.qp_type) {
        return Err(SendWrFault::OpNotForQpType(wr.op, qp.qp_type));
    }
    if wr.sg_list.len() > qp.max_send_sge as usize {
        return Err(SendWrFault::TooManySges(wr.sg_list.len(), qp.max_send_sge));
    }
    let Some(length) = super::sgl_len(wr.sg_list) else {
        return Err(SendWrFault::LengthOverflow);
    };
    if wr.send_flags.contains(SendFlags::INLINE) {
        if !carries_inline(&wr.op) {
            return Err(SendWrFault::InlineNotForOp);
        }
        if length > qp.max_inline_data {
            return Err(SendWrFault::InlineTooLong(length, qp.max_inline_data));
        }
    } else if wr.sg_list.iter().any(Sge::is_inline_only) {
        return Err(SendWrFault::InlineSgeWithoutInline);
    }
    if let SendOp::CompareSwap { remote, .. } | SendOp::FetchAdd { remote, .. } = wr.op {
        if !remote.addr.is_multiple_of(8) || wr.sg_list.len() != 1 || length < 8 {
            return Err(SendWrFault::AtomicShape);
        }
    }
    if qp.max_msg_sz.is_some_and(|max| length > max) {
        return Err(SendWrFault::TooLong);
    }
    if qp.qp_type == QpType::Ud && wr.ud.is_none() {
        return Err(SendWrFault::UdNoDestination);
    }
    Ok(length)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::RemoteAddr;

    /// The outcome, as text (`SendOp` has no `PartialEq`).
    fn check(wr: &SendWr<'_>, qp: &SendLimits) -> String {
        format!("{:?}", check_send_wr(wr, qp))
    }

    const RC: SendLimits = SendLimits {
        qp_type: QpType::Rc,
        max_send_sge: 2,
        max_inline_data: 16,
        max_msg_sz: Some(1 << 20),
    };

    #[test]
    fn each_rule_refuses_what_breaks_it() {
        let b = [0u8; 32];
        let one = [Sge::inline(&b[..8])];
        let long = [Sge::inline(&b[..17])];
        let three = [Sge::inline(&b[..1]), Sge::inline(&b[..1]), Sge::inline(&b[..1])];
        let read = SendOp::Read {
            remote: RemoteAddr { addr: 8, rkey: 1 },
        };
        let inl = SendFlags::INLINE;
        let ok = SendWr::new(1, SendOp::Send, &one).flags(inl);
        assert_eq!(check(&ok, &RC), "Ok(8)");
        let ud = SendLimits {
            qp_type: QpType::Ud,
            ..RC
        };
        assert!(check(&SendWr::new(1, read, &one).flags(inl), &ud).starts_with("Err(OpNotForQpType("));
        assert_eq!(check(&ok, &ud), "Err(UdNoDestination)");
        let wr = SendWr::new(1, SendOp::Send, &three).flags(inl);
        assert_eq!(check(&wr, &RC), "Err(TooManySges(3, 2))");
        assert_eq!(
            check(&SendWr::new(1, read, &one).flags(inl), &RC),
            "Err(InlineNotForOp)"
        );
        let wr = SendWr::new(1, SendOp::Send, &long).flags(inl);
        assert_eq!(check(&wr, &RC), "Err(InlineTooLong(17, 16))");
        assert_eq!(
            check(&SendWr::new(1, SendOp::Send, &one), &RC),
            "Err(InlineSgeWithoutInline)"
        );
        let eight = [Sge::checked(0x1000, 8, 1)];
        let four = [Sge::checked(0x1000, 4, 1)];
        for (addr, sgl, want) in [
            (8, &eight[..], "Ok(8)"),
            (4, &eight[..], "Err(AtomicShape)"),
            (8, &four[..], "Err(AtomicShape)"),
        ] {
            let op = SendOp::FetchAdd {
                remote: RemoteAddr { addr, rkey: 1 },
                add: 1,
            };
            assert_eq!(check(&SendWr::new(1, op, sgl), &RC), want, "{addr} {sgl:?}");
        }
        let tiny = SendLimits {
            max_msg_sz: Some(4),
            ..RC
        };
        assert_eq!(check(&ok, &tiny), "Err(TooLong)");
        let unchecked = SendLimits {
            max_msg_sz: None,
            ..tiny
        };
        assert_eq!(check(&ok, &unchecked), "Ok(8)");
    }
}
