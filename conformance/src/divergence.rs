//! Known divergences: places where a backend or device is known to depart
//! from the verbs contract of docs/design.md §3. A failing case listed here for the
//! device under test is reported as "known divergence" (with the reason)
//! instead of "failed", so a run on rxe or mlx5 says where the device
//! differs without turning the report red for what is already known.
//!
//! Entries match by backend, by device-name prefix (`rxe`, `mlx5_`, `siw`)
//! and by case id, where the id may end in `*` to cover a family of cases.
//! A listed case that passes is simply reported as passed.
//!
//! [`KNOWN_SOFT_BUGS`] is the same list for the soft provider: cases that
//! fail because of a soft-provider bug not yet fixed, each with a precise
//! reproduction. The test suite treats them as known, and fails when one
//! starts passing so the entry gets removed.

use softverbs::verbs::BackendKind;

/// One known divergence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Divergence {
    /// Backend the entry applies to.
    pub backend: BackendKind,
    /// Device-name prefix (`""` matches every device of the backend).
    pub device_prefix: &'static str,
    /// Case id, or a prefix followed by `*`.
    pub case: &'static str,
    /// What the device does instead, and where that is documented.
    pub reason: &'static str,
}

impl Divergence {
    /// Whether the entry covers `case_id` on a device of `backend` named
    /// `device`.
    pub fn matches(&self, backend: BackendKind, device: &str, case_id: &str) -> bool {
        if self.backend != backend || !device.starts_with(self.device_prefix) {
            return false;
        }
        match self.case.strip_suffix('*') {
            Some(prefix) => case_id.starts_with(prefix),
            None => case_id == self.case,
        }
    }
}

/// Documented divergences of hardware backends (rdma-core providers and the
/// kernel drivers behind them).
pub const KNOWN_DIVERGENCES: &[Divergence] = &[
    Divergence {
        backend: BackendKind::Hardware,
        device_prefix: "mlx5_",
        case: "mr.reg.rkey_zero_without_remote_access",
        reason: "mlx5 returns rkey == lkey for every MR, with or without remote access (the rkey is \
                 simply unusable remotely)",
    },
    Divergence {
        backend: BackendKind::Hardware,
        device_prefix: "mlx5_",
        case: "cq.create.zero_cqe",
        reason: "libmlx5 accepts cqe 0 and rounds it up to its smallest CQ (mlx5_create_cq only rejects \
                 cqe > 0x7fffffff)",
    },
    Divergence {
        backend: BackendKind::Hardware,
        device_prefix: "mlx5_",
        case: "cq.overflow.poll_fails",
        reason: "after an overrun mlx5 raises IBV_EVENT_CQ_ERR but ibv_poll_cq keeps returning the \
                 queued CQEs instead of an error",
    },
    Divergence {
        backend: BackendKind::Hardware,
        device_prefix: "rxe",
        case: "cq.overflow.poll_fails",
        reason: "rxe_cq_post reports IBV_EVENT_CQ_ERR on overflow and drops the CQE, but the CQ stays \
                 pollable",
    },
];

/// Soft-provider bugs that are known and not fixed yet. Each entry's reason
/// holds a reproduction. Empty when the soft provider passes everything.
pub const KNOWN_SOFT_BUGS: &[Divergence] = &[];

/// The entry that covers `case_id` on `device` of `backend`, if any (soft
/// bugs included).
pub fn lookup(backend: BackendKind, device: &str, case_id: &str) -> Option<&'static Divergence> {
    KNOWN_DIVERGENCES
        .iter()
        .chain(KNOWN_SOFT_BUGS.iter())
        .find(|d| d.matches(backend, device, case_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matching() {
        let d = KNOWN_DIVERGENCES
            .iter()
            .find(|d| d.device_prefix == "rxe" && d.case == "cq.overflow.poll_fails")
            .expect("entry");
        assert!(d.matches(BackendKind::Hardware, "rxe0", "cq.overflow.poll_fails"));
        assert!(!d.matches(BackendKind::Hardware, "mlx5_0", "cq.overflow.poll_fails") || d.device_prefix != "rxe");
        assert!(!d.matches(BackendKind::Soft, "rxe0", "cq.overflow.poll_fails"));
        let family = Divergence {
            backend: BackendKind::Soft,
            device_prefix: "",
            case: "err.rc.rnr.*",
            reason: "",
        };
        assert!(family.matches(BackendKind::Soft, "softverbs_1", "err.rc.rnr.retry_0"));
        assert!(!family.matches(BackendKind::Soft, "softverbs_1", "err.rc.rn"));
        assert!(lookup(BackendKind::Hardware, "mlx5_1", "cq.create.zero_cqe").is_some());
        assert!(lookup(BackendKind::Soft, "softverbs_0", "cq.create.zero_cqe").is_none());
    }
}
