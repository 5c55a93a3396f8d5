//! Every conformance case, grouped by area. Ids are `area.object.detail`:
//!
//! | area | what |
//! |---|---|
//! | `dev` | device, port, GID and P_Key queries and limits |
//! | `pd` | protection domains |
//! | `mr` | memory registration, access rules, dereg, fast registration |
//! | `mw` | memory windows (type 1 and 2) |
//! | `cq` | completion queues: limits, resize, overflow, notify, channels |
//! | `qp` | QP creation limits and the `modify_qp` state table |
//! | `post` | posting errors (docs/design.md §3.3) |
//! | `data` | every opcode on every QP type, SGEs, inline, immediate data, sizes |
//! | `comp` | completion semantics: signaling, exactly once, flush order |
//! | `order` | ordering and fences (docs/design.md §3.5) |
//! | `err` | the error table of docs/design.md §3.4 |
//! | `srq` | shared receive queues and the limit event |
//! | `hotplug`, `netns` | device removal mid-traffic, namespace moves (soft) |

use crate::case::Case;

mod cq;
mod data;
mod data_stress;
mod device;
mod errors;
mod hotplug;
mod memory;
mod ordering;
mod posting;
mod qp;
mod qp_state;
mod srq;

/// Every case, in report order.
pub fn all() -> Vec<Case> {
    let mut out = Vec::new();
    device::register(&mut out);
    memory::register(&mut out);
    cq::register(&mut out);
    qp::register(&mut out);
    qp_state::register(&mut out);
    posting::register(&mut out);
    data::register(&mut out);
    ordering::register(&mut out);
    errors::register(&mut out);
    srq::register(&mut out);
    hotplug::register(&mut out);
    out
}
