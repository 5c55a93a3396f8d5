//! How the hardware backend of the CM maps librdmacm onto this CM's ids:
//! rdma_cm's event numbers (`enum rdma_cm_event_type`) to [`CmEventKind`]
//! and to the id's next state, and the QP attribute mask of
//! `rdma_init_qp_attr` to [`QpAttrMask`].
//!
//! Pure Rust, in every build, so that the translation is tested without a
//! device or librdmacm; `hw.rs` (feature `hardware`) applies it to the
//! events it reads from librdmacm's event channel.

use super::agent::IdState;
use super::CmEventKind;
use crate::verbs::QpAttrMask;

/// `RDMA_CM_EVENT_ADDR_RESOLVED`.
pub(crate) const ADDR_RESOLVED: u32 = 0;
/// `RDMA_CM_EVENT_ADDR_ERROR`.
pub(crate) const ADDR_ERROR: u32 = 1;
/// `RDMA_CM_EVENT_ROUTE_RESOLVED`.
pub(crate) const ROUTE_RESOLVED: u32 = 2;
/// `RDMA_CM_EVENT_ROUTE_ERROR`.
pub(crate) const ROUTE_ERROR: u32 = 3;
/// `RDMA_CM_EVENT_CONNECT_REQUEST`.
pub(crate) const CONNECT_REQUEST: u32 = 4;
/// `RDMA_CM_EVENT_CONNECT_RESPONSE`.
pub(crate) const CONNECT_RESPONSE: u32 = 5;
/// `RDMA_CM_EVENT_CONNECT_ERROR`.
pub(crate) const CONNECT_ERROR: u32 = 6;
/// `RDMA_CM_EVENT_UNREACHABLE`.
pub(crate) const UNREACHABLE: u32 = 7;
/// `RDMA_CM_EVENT_REJECTED`.
pub(crate) const REJECTED: u32 = 8;
/// `RDMA_CM_EVENT_ESTABLISHED`.
pub(crate) const ESTABLISHED: u32 = 9;
/// `RDMA_CM_EVENT_DISCONNECTED`.
pub(crate) const DISCONNECTED: u32 = 10;
/// `RDMA_CM_EVENT_DEVICE_REMOVAL`.
pub(crate) const DEVICE_REMOVAL: u32 = 11;
/// `RDMA_CM_EVENT_MULTICAST_JOIN`.
pub(crate) const MULTICAST_JOIN: u32 = 12;
/// `RDMA_CM_EVENT_MULTICAST_ERROR`.
pub(crate) const MULTICAST_ERROR: u32 = 13;
/// `RDMA_CM_EVENT_ADDR_CHANGE`.
pub(crate) const ADDR_CHANGE: u32 = 14;
/// `RDMA_CM_EVENT_TIMEWAIT_EXIT`.
pub(crate) const TIMEWAIT_EXIT: u32 = 15;

/// What the CM does with one librdmacm event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Deliver `kind` to the application, the id moving to `next` (`None`:
    /// it keeps its state).
    Deliver {
        /// The event the application sees.
        kind: CmEventKind,
        /// The id's state afterwards.
        next: Option<IdState>,
    },
    /// A request on a listener: make a new id in `REQ_RCVD` (TCP) or
    /// `SIDR_REQ_RCVD` (UDP) and deliver `ConnectRequest` with it.
    NewRequest,
    /// The REP reached an id whose QP the CM drives: move the QP to RTR
    /// and RTS, call `rdma_establish`, then deliver `Established` (what
    /// librdmacm does for an id with a QP).
    EstablishQp,
    /// The id's device went away: deliver `DeviceRemoval` unless the
    /// subsystem's removal already did (exactly once per id).
    Removal,
    /// Not for the application (multicast: never joined; an event number
    /// newer than this code): acknowledged and counted as dropped.
    Drop,
}

/// The action for librdmacm event `event` on an id in `state` (`has_qp`:
/// the id has a QP this CM moves; `udp`: the id is in the UDP port
/// space).
///
/// rdma_cm's `ADDR_ERROR` and `ROUTE_ERROR` have no kind of their own in
/// this API: they arrive as [`CmEventKind::Unreachable`] with librdmacm's
/// status (a negative errno), the id back where it was before the
/// resolution, as rdma_cm leaves it.
pub(crate) fn action(event: u32, state: IdState, has_qp: bool, udp: bool) -> Action {
    use CmEventKind as K;
    let deliver = |kind, next| Action::Deliver { kind, next };
    match event {
        ADDR_RESOLVED => deliver(K::AddrResolved, Some(IdState::AddrResolved)),
        ADDR_ERROR => deliver(K::Unreachable, Some(IdState::AddrBound)),
        ROUTE_RESOLVED => deliver(K::RouteResolved, Some(IdState::RouteResolved)),
        ROUTE_ERROR => deliver(K::Unreachable, Some(IdState::AddrResolved)),
        CONNECT_REQUEST => Action::NewRequest,
        CONNECT_RESPONSE if has_qp && !udp => Action::EstablishQp,
        CONNECT_RESPONSE => deliver(K::ConnectResponse, Some(IdState::RepRcvd)),
        CONNECT_ERROR => deliver(K::ConnectError, Some(IdState::Done)),
        UNREACHABLE => deliver(K::Unreachable, Some(IdState::Done)),
        REJECTED => deliver(K::Rejected, Some(IdState::Done)),
        // UD: the SIDR reply; RC: the RTU (passive) or librdmacm's own
        // establish (active).
        ESTABLISHED => deliver(K::Established, Some(IdState::Established)),
        DISCONNECTED => deliver(
            K::Disconnected,
            Some(if state == IdState::Listen {
                IdState::Listen
            } else {
                IdState::TimeWait
            }),
        ),
        DEVICE_REMOVAL => Action::Removal,
        ADDR_CHANGE => deliver(K::AddrChange, None),
        TIMEWAIT_EXIT => deliver(K::TimewaitExit, Some(IdState::Done)),
        MULTICAST_JOIN | MULTICAST_ERROR => Action::Drop,
        _ => Action::Drop,
    }
}

/// The state a new id from a request starts in.
pub(crate) fn request_state(udp: bool) -> IdState {
    if udp {
        IdState::SidrReqRcvd
    } else {
        IdState::ReqRcvd
    }
}

/// The mask `rdma_init_qp_attr` returned (`enum ibv_qp_attr_mask`, the
/// same bits as [`QpAttrMask`]); bits this API does not know are dropped,
/// so the QP is never told to change what the caller cannot see.
pub(crate) fn qp_mask(raw: i32) -> QpAttrMask {
    QpAttrMask::from_bits_truncate(raw as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [IdState; 16] = [
        IdState::Idle,
        IdState::AddrBound,
        IdState::AddrResolved,
        IdState::RouteResolved,
        IdState::Listen,
        IdState::ReqSent,
        IdState::RepRcvd,
        IdState::ReqRcvd,
        IdState::RepSent,
        IdState::Established,
        IdState::DreqSent,
        IdState::TimeWait,
        IdState::Done,
        IdState::SidrReqSent,
        IdState::SidrReqRcvd,
        IdState::Removed,
    ];

    fn kind(a: Action) -> Option<CmEventKind> {
        match a {
            Action::Deliver { kind, .. } => Some(kind),
            _ => None,
        }
    }

    #[test]
    fn every_rdma_cm_event_has_its_kind() {
        // rdma_cma.h's numbering, each to the kind of the same name.
        let table = [
            (ADDR_RESOLVED, CmEventKind::AddrResolved),
            (ROUTE_RESOLVED, CmEventKind::RouteResolved),
            (CONNECT_ERROR, CmEventKind::ConnectError),
            (UNREACHABLE, CmEventKind::Unreachable),
            (REJECTED, CmEventKind::Rejected),
            (ESTABLISHED, CmEventKind::Established),
            (DISCONNECTED, CmEventKind::Disconnected),
            (ADDR_CHANGE, CmEventKind::AddrChange),
            (TIMEWAIT_EXIT, CmEventKind::TimewaitExit),
        ];
        for (n, k) in table {
            for s in ALL {
                for qp in [false, true] {
                    assert_eq!(kind(action(n, s, qp, false)), Some(k), "event {n} in {s:?}");
                }
            }
        }
    }

    #[test]
    fn resolution_errors_are_unreachable_and_step_back() {
        assert_eq!(
            action(ADDR_ERROR, IdState::AddrBound, false, false),
            Action::Deliver {
                kind: CmEventKind::Unreachable,
                next: Some(IdState::AddrBound)
            }
        );
        assert_eq!(
            action(ROUTE_ERROR, IdState::AddrResolved, false, false),
            Action::Deliver {
                kind: CmEventKind::Unreachable,
                next: Some(IdState::AddrResolved)
            }
        );
    }

    #[test]
    fn a_response_establishes_an_id_with_a_qp() {
        assert_eq!(
            action(CONNECT_RESPONSE, IdState::ReqSent, true, false),
            Action::EstablishQp
        );
        assert_eq!(
            action(CONNECT_RESPONSE, IdState::ReqSent, false, false),
            Action::Deliver {
                kind: CmEventKind::ConnectResponse,
                next: Some(IdState::RepRcvd)
            }
        );
        // UD never gets a response to establish (SIDR ends in ESTABLISHED).
        assert_ne!(
            action(CONNECT_RESPONSE, IdState::SidrReqSent, true, true),
            Action::EstablishQp
        );
    }

    #[test]
    fn the_connection_states_follow_the_events() {
        let next = |e, s| match action(e, s, true, false) {
            Action::Deliver { next, .. } => next,
            _ => None,
        };
        assert_eq!(next(ADDR_RESOLVED, IdState::Idle), Some(IdState::AddrResolved));
        assert_eq!(
            next(ROUTE_RESOLVED, IdState::AddrResolved),
            Some(IdState::RouteResolved)
        );
        assert_eq!(next(ESTABLISHED, IdState::RepSent), Some(IdState::Established));
        assert_eq!(next(DISCONNECTED, IdState::Established), Some(IdState::TimeWait));
        assert_eq!(next(DISCONNECTED, IdState::DreqSent), Some(IdState::TimeWait));
        assert_eq!(next(TIMEWAIT_EXIT, IdState::TimeWait), Some(IdState::Done));
        assert_eq!(next(REJECTED, IdState::ReqSent), Some(IdState::Done));
        assert_eq!(next(UNREACHABLE, IdState::ReqSent), Some(IdState::Done));
        assert_eq!(next(CONNECT_ERROR, IdState::RepSent), Some(IdState::Done));
        assert_eq!(next(ADDR_CHANGE, IdState::Established), None);
        assert_eq!(request_state(false), IdState::ReqRcvd);
        assert_eq!(request_state(true), IdState::SidrReqRcvd);
    }

    #[test]
    fn requests_removal_and_the_rest() {
        for s in ALL {
            assert_eq!(action(CONNECT_REQUEST, s, false, false), Action::NewRequest);
            assert_eq!(action(DEVICE_REMOVAL, s, true, false), Action::Removal);
            assert_eq!(action(MULTICAST_JOIN, s, false, true), Action::Drop);
            assert_eq!(action(MULTICAST_ERROR, s, false, true), Action::Drop);
            assert_eq!(action(16, s, false, false), Action::Drop);
            assert_eq!(action(u32::MAX, s, false, false), Action::Drop);
        }
    }

    #[test]
    fn the_mask_keeps_the_known_bits() {
        // What rdma_init_qp_attr returns for an RC QP's RTR on RoCE.
        let rtr = 1 | (1 << 7) | (1 << 8) | (1 << 12) | (1 << 17) | (1 << 15) | (1 << 20);
        assert_eq!(
            qp_mask(rtr),
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER
                | QpAttrMask::DEST_QPN
        );
        // A bit this API has no field for is not passed on.
        assert_eq!(qp_mask(1 | (1 << 30)), QpAttrMask::STATE);
    }
}
