//! `softverbs devinfo`: device and port attributes, in the layout of
//! rdma-core's `ibv_devinfo` (so that people and scripts that know it read
//! it), plus a `backend:` line.
//!
//! ```text
//! hca_id: softverbs_0
//!         transport:                      InfiniBand (0)
//!         backend:                        soft
//!         fw_ver:                         0.1.0
//!         node_guid:                      0253:7600:7f53:5601
//!         ...
//!                 port:   1
//!                         state:                  PORT_ACTIVE (4)
//!                         ...
//!                         link_layer:             Ethernet
//! ```
//!
//! `-v` adds, in `ibv_devinfo -v`'s order and layout, every device
//! attribute, the extended capabilities (ODP, timestamps, TSO, RSS, packet
//! pacing, tag matching), `num_comp_vectors` and, per port, the remaining
//! port attributes and the non-zero GID table entries (a RoCE v2 GID as
//! `inet_ntop` writes it, with `, RoCE v2`), then softverbs' own lines
//! (`max_fast_reg_page_list_len`, `max_inline_data`, the soft device's
//! link and counters). For a soft device the attributes the verbs API does
//! not carry are what the soft provider has: none of EE, RDD, raw QPs,
//! multicast, FMR, ODP, TSO, RSS, pacing, tag matching, completion
//! timestamps, and one completion vector (the values softverbs'
//! `libibverbs.so.1` reports). For a hardware device those lines are left
//! out rather than printed as invented values.

use std::fmt::Write as _;
use std::io::Write;

use softverbs::verbs::{AtomicCap, BackendKind, Context, Device, DeviceAttr, DeviceCapFlags, Gid, LinkLayer, PortAttr};

use super::{eprintln_safe, CliError, Env};

/// Arguments of `softverbs devinfo`.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(args_override_self = true)]
pub struct Args {
    /// Show only this device (default: every device)
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub device: Option<String>,
    /// Show only this port (default: every port)
    #[arg(short = 'i', long = "ib-port", value_name = "PORT",
          value_parser = clap::value_parser!(u8).range(1..))]
    pub port: Option<u8>,
    /// Print only the device names
    #[arg(short = 'l', long)]
    pub list: bool,
    /// Print all the attributes of the device(s), and the GID tables
    #[arg(short = 'v', long)]
    pub verbose: bool,
}

/// Shows the selected devices.
///
/// Each device is opened and queried on its own; one that fails is
/// reported on standard error and the others are still shown.
///
/// # Errors
///
/// [`CliError::NotFound`] when there is no (such) device or port; a verbs
/// error (exit 3) when a device cannot be opened or queried.
pub fn run(env: &Env, args: &Args, out: &mut dyn Write) -> Result<(), CliError> {
    let kind = env.global.listing_backend();
    let devs = match &args.device {
        Some(name) => vec![env.device(kind, name)?],
        None => env.devices(kind)?,
    };
    if args.list {
        let mut s = format!("{} HCA{} found:\n", devs.len(), if devs.len() == 1 { "" } else { "s" });
        for d in &devs {
            let _ = writeln!(s, "\t{}", d.name());
        }
        s.push('\n');
        out.write_all(s.as_bytes())?;
        return Ok(());
    }
    // A single device: its error is the command's. Several: report each
    // failure, show the rest, exit with the worst status.
    if devs.len() == 1 {
        let text = device_info(&devs[0], args)?;
        out.write_all(text.as_bytes())?;
        return Ok(());
    }
    let mut status = 0;
    for d in &devs {
        match device_info(d, args) {
            Ok(text) => out.write_all(text.as_bytes())?,
            Err(e) => {
                out.flush()?;
                eprintln_safe(&format!("softverbs: {e}"));
                status = status.max(e.exit_status());
            }
        }
    }
    if status != 0 {
        return Err(CliError::Reported(status));
    }
    Ok(())
}

/// Opens `dev` and renders its report.
///
/// # Errors
///
/// A verbs error naming the device; [`CliError::NotFound`] for a port
/// beyond the device's ports.
pub fn device_info(dev: &Device, args: &Args) -> Result<String, CliError> {
    let name = dev.name().to_string();
    let ctx = dev.open().map_err(|e| CliError::verbs(&name, e))?;
    render(dev, &ctx, args)
}

/// Renders the report of an open device.
///
/// # Errors
///
/// As [`device_info`].
pub fn render(dev: &Device, ctx: &Context, args: &Args) -> Result<String, CliError> {
    let name = dev.name();
    let attr = ctx.query_device().map_err(|e| CliError::verbs(name, e))?;
    if let Some(p) = args.port {
        if p > attr.phys_port_cnt {
            return Err(CliError::NotFound(format!(
                "{name}: port {p} does not exist (the device has {} port{})",
                attr.phys_port_cnt,
                if attr.phys_port_cnt == 1 { "" } else { "s" }
            )));
        }
    }
    let mut s = String::new();
    let soft = dev.backend() == BackendKind::Soft;
    device_lines(&mut s, dev, &attr, args.verbose);
    if args.verbose {
        if soft {
            soft_ex_lines(&mut s);
        }
        let _ = writeln!(s, "\tmax_fast_reg_page_list_len:\t{}", attr.max_fast_reg_page_list_len);
        let _ = writeln!(s, "\tmax_inline_data:\t\t{}", attr.max_inline_data);
        soft_lines(&mut s, dev);
    }
    for port in 1..=attr.phys_port_cnt {
        if args.port.is_some_and(|p| p != port) {
            continue;
        }
        let pattr = ctx
            .query_port(port)
            .map_err(|e| CliError::verbs(format!("{name} port {port}"), e))?;
        port_lines(&mut s, port, &pattr, args.verbose, soft);
        if args.verbose {
            for index in 0..pattr.gid_tbl_len {
                let gid = ctx
                    .query_gid(port, index)
                    .map_err(|e| CliError::verbs(format!("{name} port {port} GID[{index}]"), e))?;
                if !gid.is_zero() {
                    let _ = writeln!(s, "{}", gid_line(index, &gid, soft, pattr.link_layer));
                }
            }
        }
        s.push('\n');
    }
    Ok(s)
}

/// The device part of the report (`hca_id` to `phys_port_cnt`, and with
/// `verbose` the limits and capability flags).
pub fn device_lines(s: &mut String, dev: &Device, a: &DeviceAttr, verbose: bool) {
    // Every device this API knows (soft RoCEv2, ibverbs RoCE/IB) uses the
    // InfiniBand transport, as `ibv_devinfo` reports for RoCE.
    let _ = writeln!(s, "hca_id:\t{}", dev.name());
    let _ = writeln!(s, "\ttransport:\t\t\tInfiniBand (0)");
    let _ = writeln!(s, "\tbackend:\t\t\t{}", dev.backend());
    if !a.fw_ver.is_empty() {
        let _ = writeln!(s, "\tfw_ver:\t\t\t\t{}", a.fw_ver);
    }
    let _ = writeln!(s, "\tnode_guid:\t\t\t{}", a.node_guid);
    let _ = writeln!(s, "\tsys_image_guid:\t\t\t{}", a.sys_image_guid);
    let _ = writeln!(s, "\tvendor_id:\t\t\t0x{:04x}", a.vendor_id);
    let _ = writeln!(s, "\tvendor_part_id:\t\t\t{}", a.vendor_part_id);
    let _ = writeln!(s, "\thw_ver:\t\t\t\t0x{:X}", a.hw_ver);
    let _ = writeln!(s, "\tphys_port_cnt:\t\t\t{}", a.phys_port_cnt);
    if !verbose {
        return;
    }
    // The soft provider has none of these (what softverbs'
    // libibverbs.so.1 reports too); the verbs API does not carry them for
    // hardware, so they are not printed there.
    let soft = dev.backend() == BackendKind::Soft;
    let _ = writeln!(s, "\tmax_mr_size:\t\t\t0x{:x}", a.max_mr_size);
    let _ = writeln!(s, "\tpage_size_cap:\t\t\t0x{:x}", a.page_size_cap);
    let _ = writeln!(s, "\tmax_qp:\t\t\t\t{}", a.max_qp);
    let _ = writeln!(s, "\tmax_qp_wr:\t\t\t{}", a.max_qp_wr);
    let low = a.device_cap_flags.bits() & 0xffff_ffff;
    let _ = writeln!(s, "\tdevice_cap_flags:\t\t0x{low:08x}");
    for flag in cap_flag_names(DeviceCapFlags::from_bits_retain(low)) {
        let _ = writeln!(s, "\t\t\t\t\t{flag}");
    }
    let _ = writeln!(s, "\tmax_sge:\t\t\t{}", a.max_sge);
    let _ = writeln!(s, "\tmax_sge_rd:\t\t\t{}", a.max_sge_rd);
    let _ = writeln!(s, "\tmax_cq:\t\t\t\t{}", a.max_cq);
    let _ = writeln!(s, "\tmax_cqe:\t\t\t{}", a.max_cqe);
    let _ = writeln!(s, "\tmax_mr:\t\t\t\t{}", a.max_mr);
    let _ = writeln!(s, "\tmax_pd:\t\t\t\t{}", a.max_pd);
    let _ = writeln!(s, "\tmax_qp_rd_atom:\t\t\t{}", a.max_qp_rd_atom);
    if soft {
        let _ = writeln!(s, "\tmax_ee_rd_atom:\t\t\t0");
    }
    let _ = writeln!(s, "\tmax_res_rd_atom:\t\t{}", a.max_res_rd_atom);
    let _ = writeln!(s, "\tmax_qp_init_rd_atom:\t\t{}", a.max_qp_init_rd_atom);
    if soft {
        let _ = writeln!(s, "\tmax_ee_init_rd_atom:\t\t0");
    }
    let _ = writeln!(s, "\tatomic_cap:\t\t\t{}", atomic_cap_str(a.atomic_cap));
    if soft {
        let _ = writeln!(s, "\tmax_ee:\t\t\t\t0");
        let _ = writeln!(s, "\tmax_rdd:\t\t\t0");
    }
    let _ = writeln!(s, "\tmax_mw:\t\t\t\t{}", a.max_mw);
    if soft {
        let _ = writeln!(s, "\tmax_raw_ipv6_qp:\t\t0");
        let _ = writeln!(s, "\tmax_raw_ethy_qp:\t\t0");
        let _ = writeln!(s, "\tmax_mcast_grp:\t\t\t0");
        let _ = writeln!(s, "\tmax_mcast_qp_attach:\t\t0");
        let _ = writeln!(s, "\tmax_total_mcast_qp_attach:\t0");
    }
    let _ = writeln!(s, "\tmax_ah:\t\t\t\t{}", a.max_ah);
    if soft {
        let _ = writeln!(s, "\tmax_fmr:\t\t\t0");
    }
    let _ = writeln!(s, "\tmax_srq:\t\t\t{}", a.max_srq);
    if a.max_srq != 0 {
        let _ = writeln!(s, "\tmax_srq_wr:\t\t\t{}", a.max_srq_wr);
        let _ = writeln!(s, "\tmax_srq_sge:\t\t\t{}", a.max_srq_sge);
    }
    let _ = writeln!(s, "\tmax_pkeys:\t\t\t{}", a.max_pkeys);
    let _ = writeln!(s, "\tlocal_ca_ack_delay:\t\t{}", a.local_ca_ack_delay);
}

/// The extended capabilities `ibv_devinfo -v` prints after
/// `local_ca_ack_delay`, as the soft provider has them (none of ODP,
/// completion timestamps, extended flags, TSO, RSS, work queues, packet
/// pacing or tag matching; one completion vector), in its layout.
pub fn soft_ex_lines(s: &mut String) {
    s.push_str("\tgeneral_odp_caps:\n");
    for t in ["rc", "uc", "ud", "xrc"] {
        let _ = writeln!(s, "\t{t}_odp_caps:\n\t\t\t\t\tNO SUPPORT");
    }
    s.push_str("\tcompletion_timestamp_mask not supported\n");
    s.push_str("\tcore clock not supported\n");
    s.push_str("\tdevice_cap_flags_ex:\t\t0x0\n");
    s.push_str("\ttso_caps:\n\t\tmax_tso:\t\t\t0\n");
    s.push_str("\trss_caps:\n");
    s.push_str("\t\tmax_rwq_indirection_tables:\t\t\t0\n");
    s.push_str("\t\tmax_rwq_indirection_table_size:\t\t\t0\n");
    s.push_str("\t\trx_hash_function:\t\t\t\t0x0\n");
    s.push_str("\t\trx_hash_fields_mask:\t\t\t\t0x0\n");
    s.push_str("\tmax_wq_type_rq:\t\t\t0\n");
    s.push_str("\tpacket_pacing_caps:\n");
    s.push_str("\t\tqp_rate_limit_min:\t0kbps\n");
    s.push_str("\t\tqp_rate_limit_max:\t0kbps\n");
    s.push_str("\ttag matching not supported\n");
    s.push_str("\tnum_comp_vectors:\t\t1\n");
}

/// One GID table line: a RoCE v2 GID (every soft device's, on an Ethernet
/// port) as `inet_ntop` writes it followed by `, RoCE v2`, as `ibv_devinfo
/// -v`; any other as eight groups of four hex digits (the GID type of a
/// hardware GID is not known here).
pub fn gid_line(index: u32, gid: &Gid, soft: bool, link_layer: LinkLayer) -> String {
    if soft && link_layer == LinkLayer::Ethernet {
        format!("\t\t\tGID[{index:3}]:\t\t{}, RoCE v2", std::net::Ipv6Addr::from(gid.0))
    } else {
        format!("\t\t\tGID[{index:3}]:\t\t{gid}")
    }
}

/// For a soft device (with `-v`): its link, engine mode and every packet
/// counter (what was received, sent, retransmitted, and what was dropped
/// and why: malformed, bad ICRC, unknown QP, wrong source, …), then the
/// link's own counters. Nothing for other devices.
pub fn soft_lines(s: &mut String, dev: &Device) {
    let Some(soft) = softverbs::soft::SoftDevice::of(dev) else {
        return;
    };
    let shared = soft.shared();
    let _ = writeln!(s, "\tsoft_link:\t\t\t{}", shared.link_name());
    let mode = match shared.mode() {
        softverbs::soft::engine::EngineMode::Inline => "inline".to_string(),
        softverbs::soft::engine::EngineMode::ProgressThread { spin } => {
            format!("progress thread (spin {} us)", spin.as_micros())
        }
    };
    let _ = writeln!(s, "\tsoft_engine:\t\t\t{mode}");
    for p in shared.link_peers() {
        let _ = writeln!(s, "\tsoft_peer:\t\t\t{p}");
    }
    let _ = writeln!(s, "\tsoft_counters:");
    for (name, value) in soft.counters() {
        let tabs = if name.len() >= 15 { "\t" } else { "\t\t" };
        let _ = writeln!(s, "\t\t{name}:{tabs}{value}");
    }
}

/// The port part of the report, without the GID table. `soft`: the port
/// of a soft device, whose `port_cap_flags2` and `init_type_reply` (which
/// the verbs API does not carry) are known to be 0; for other devices
/// those lines are left out.
pub fn port_lines(s: &mut String, port: u8, p: &PortAttr, verbose: bool, soft: bool) {
    let _ = writeln!(s, "\t\tport:\t{port}");
    let _ = writeln!(s, "\t\t\tstate:\t\t\t{} ({})", p.state.name(), p.state.as_raw());
    let _ = writeln!(s, "\t\t\tmax_mtu:\t\t{} ({})", p.max_mtu.name(), p.max_mtu.as_raw());
    let _ = writeln!(
        s,
        "\t\t\tactive_mtu:\t\t{} ({})",
        p.active_mtu.name(),
        p.active_mtu.as_raw()
    );
    let _ = writeln!(s, "\t\t\tsm_lid:\t\t\t{}", p.sm_lid);
    let _ = writeln!(s, "\t\t\tport_lid:\t\t{}", p.lid);
    let _ = writeln!(s, "\t\t\tport_lmc:\t\t0x{:02x}", p.lmc);
    let _ = writeln!(s, "\t\t\tlink_layer:\t\t{}", link_layer_str(p.link_layer));
    if !verbose {
        return;
    }
    let _ = writeln!(s, "\t\t\tmax_msg_sz:\t\t0x{:x}", p.max_msg_sz);
    let _ = writeln!(s, "\t\t\tport_cap_flags:\t\t0x{:08x}", p.port_cap_flags);
    if soft {
        let _ = writeln!(s, "\t\t\tport_cap_flags2:\t0x0000");
    }
    let _ = writeln!(s, "\t\t\tmax_vl_num:\t\t{} ({})", vl_str(p.max_vl_num), p.max_vl_num);
    let _ = writeln!(s, "\t\t\tbad_pkey_cntr:\t\t0x{:x}", p.bad_pkey_cntr);
    let _ = writeln!(s, "\t\t\tqkey_viol_cntr:\t\t0x{:x}", p.qkey_viol_cntr);
    let _ = writeln!(s, "\t\t\tsm_sl:\t\t\t{}", p.sm_sl);
    let _ = writeln!(s, "\t\t\tpkey_tbl_len:\t\t{}", p.pkey_tbl_len);
    let _ = writeln!(s, "\t\t\tgid_tbl_len:\t\t{}", p.gid_tbl_len);
    let _ = writeln!(s, "\t\t\tsubnet_timeout:\t\t{}", p.subnet_timeout);
    if soft {
        let _ = writeln!(s, "\t\t\tinit_type_reply:\t0");
    }
    let _ = writeln!(
        s,
        "\t\t\tactive_width:\t\t{}X ({})",
        width_str(p.active_width),
        p.active_width
    );
    let _ = writeln!(
        s,
        "\t\t\tactive_speed:\t\t{} ({})",
        speed_str(p.active_speed),
        p.active_speed
    );
    let _ = writeln!(
        s,
        "\t\t\tphys_state:\t\t{} ({})",
        phys_state_str(p.phys_state),
        p.phys_state
    );
}

/// The names of the set capability flags, then `Unknown flags: 0x…` for
/// bits without a name.
pub fn cap_flag_names(flags: DeviceCapFlags) -> Vec<String> {
    let mut v: Vec<String> = flags.iter_names().map(|(n, _)| n.to_string()).collect();
    let unknown = flags.bits() & !DeviceCapFlags::all().bits();
    if unknown != 0 {
        v.push(format!("Unknown flags: 0x{unknown:X}"));
    }
    v
}

/// `ATOMIC_HCA (1)`, as `ibv_devinfo` prints the atomic capability.
pub fn atomic_cap_str(cap: Option<AtomicCap>) -> String {
    match cap {
        Some(c) => format!("{} ({})", c.name(), c.as_raw()),
        None => "invalid atomic capability".to_string(),
    }
}

/// The link layer as `ibv_devinfo` prints it (unspecified is InfiniBand).
pub fn link_layer_str(l: LinkLayer) -> &'static str {
    match l {
        LinkLayer::Unspecified | LinkLayer::InfiniBand => "InfiniBand",
        LinkLayer::Ethernet => "Ethernet",
    }
}

/// Port width in lanes (`active_width` encoding).
pub fn width_str(width: u8) -> &'static str {
    match width {
        1 => "1",
        2 => "4",
        4 => "8",
        8 => "12",
        16 => "2",
        _ => "invalid width",
    }
}

/// Per-lane speed (`active_speed` encoding).
pub fn speed_str(speed: u8) -> &'static str {
    match speed {
        1 => "2.5 Gbps",
        2 => "5.0 Gbps",
        4 | 8 => "10.0 Gbps",
        16 => "14.0 Gbps",
        32 => "25.0 Gbps",
        64 => "50.0 Gbps",
        128 => "100.0 Gbps",
        _ => "invalid speed",
    }
}

/// Number of virtual lanes (`max_vl_num` encoding).
pub fn vl_str(vl: u8) -> &'static str {
    match vl {
        1 => "1",
        2 => "2",
        3 => "4",
        4 => "8",
        5 => "15",
        _ => "invalid value",
    }
}

/// Physical port state.
pub fn phys_state_str(state: u8) -> &'static str {
    match state {
        1 => "SLEEP",
        2 => "POLLING",
        3 => "DISABLED",
        4 => "PORT_CONFIGURATION TRAINING",
        5 => "LINK_UP",
        6 => "LINK_ERROR_RECOVERY",
        7 => "PHY TEST",
        _ => "invalid physical state",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    use softverbs::verbs::backend::{CompChannelOps, ContextOps, CqOps, PdOps};
    use softverbs::verbs::{AsyncEvent, Error, ErrorKind, Gid, Guid, Mtu, PortState, Result, Verb};

    fn device() -> Device {
        softverbs::soft::embedded_default().expect("embedded default");
        softverbs::verbs::devices(Some(softverbs::verbs::BackendKind::Soft))
            .expect("soft devices")
            .into_iter()
            .find(|d| d.name() == "softverbs_0")
            .expect("softverbs_0")
    }

    fn soft_attr() -> DeviceAttr {
        softverbs::soft::embedded_default().expect("embedded default")[0].attr()
    }

    #[test]
    fn device_part_layout() {
        let mut s = String::new();
        let mut a = soft_attr();
        a.node_guid = Guid(0x0002_c903_0001_0203);
        device_lines(&mut s, &device(), &a, false);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "hca_id:\tsoftverbs_0");
        assert_eq!(lines[1], "\ttransport:\t\t\tInfiniBand (0)");
        assert!(lines.contains(&"\tnode_guid:\t\t\t0002:c903:0001:0203"));
        assert!(lines.contains(&"\tphys_port_cnt:\t\t\t1"));
        assert!(!s.contains("max_qp"));

        let mut v = String::new();
        device_lines(&mut v, &device(), &a, true);
        for key in [
            "max_qp:",
            "max_qp_wr:",
            "device_cap_flags:",
            "max_ee_rd_atom:",
            "max_raw_ethy_qp:",
            "max_mcast_qp_attach:",
            "max_fmr:",
            "atomic_cap:\t\t\tATOMIC_HCA (1)",
        ] {
            assert!(v.contains(key), "missing {key} in\n{v}");
        }
        assert!(v.contains("\t\t\t\t\tMEM_MGT_EXTENSIONS\n"));
    }

    #[test]
    fn port_part_layout() {
        let p = softverbs::soft::embedded_default().expect("embedded default")[0].port_attr();
        let mut s = String::new();
        port_lines(&mut s, 1, &p, false, true);
        assert_eq!(
            s,
            "\t\tport:\t1\n\
             \t\t\tstate:\t\t\tPORT_ACTIVE (4)\n\
             \t\t\tmax_mtu:\t\t4096 (5)\n\
             \t\t\tactive_mtu:\t\t4096 (5)\n\
             \t\t\tsm_lid:\t\t\t0\n\
             \t\t\tport_lid:\t\t0\n\
             \t\t\tport_lmc:\t\t0x00\n\
             \t\t\tlink_layer:\t\tEthernet\n"
        );
        let mut v = String::new();
        let mut p2 = p.clone();
        p2.state = PortState::Down;
        p2.active_mtu = Mtu::Mtu1024;
        port_lines(&mut v, 1, &p2, true, true);
        assert!(v.contains("state:\t\t\tPORT_DOWN (1)"));
        assert!(v.contains("active_mtu:\t\t1024 (3)"));
        assert!(v.contains("active_width:\t\t4X (2)"));
        assert!(v.contains("phys_state:\t\tLINK_UP (5)"));
    }

    /// A context that answers the queries from a soft device's attributes
    /// (the soft provider's own contexts are not needed to test layout).
    struct FakeCtx(std::sync::Arc<softverbs::soft::SoftDevice>);

    impl ContextOps for FakeCtx {
        fn device_name(&self) -> &str {
            "softverbs_0"
        }
        fn query_device(&self) -> Result<DeviceAttr> {
            Ok(self.0.attr())
        }
        fn query_port(&self, port: u8) -> Result<PortAttr> {
            match port {
                1 => Ok(self.0.port_attr()),
                _ => Err(unsupported(Verb::QueryPort)),
            }
        }
        fn query_gid(&self, _port: u8, index: u32) -> Result<Gid> {
            Ok(self.0.gids().get(index as usize).copied().unwrap_or(Gid::ZERO))
        }
        fn query_pkey(&self, _port: u8, _index: u16) -> Result<u16> {
            Ok(0xffff)
        }
        fn alloc_pd(&self) -> Result<Arc<dyn PdOps>> {
            Err(unsupported(Verb::AllocPd))
        }
        fn create_comp_channel(&self) -> Result<Arc<dyn CompChannelOps>> {
            Err(unsupported(Verb::CreateCompChannel))
        }
        fn create_cq(
            &self,
            _cqe: u32,
            _context: u64,
            _channel: Option<&Arc<dyn CompChannelOps>>,
            _comp_vector: u32,
        ) -> Result<Arc<dyn CqOps>> {
            Err(unsupported(Verb::CreateCq))
        }
        fn get_async_event(&self, _timeout: Option<Duration>) -> Result<Option<AsyncEvent>> {
            Ok(None)
        }
        fn async_fd(&self) -> Option<std::os::fd::RawFd> {
            None
        }
    }

    fn unsupported(verb: Verb) -> Error {
        Error::new(verb, ErrorKind::NotSupported, "test double")
    }

    fn fake_context() -> Context {
        let soft = softverbs::soft::embedded_default().expect("embedded default");
        Context::from_ops(Arc::new(FakeCtx(soft[0].clone())))
    }

    #[test]
    fn full_report() {
        let args = Args {
            verbose: true,
            ..Args::default()
        };
        let s = render(&device(), &fake_context(), &args).expect("render");
        assert!(s.starts_with("hca_id:\tsoftverbs_0\n\ttransport:\t\t\tInfiniBand (0)\n"));
        assert!(s.contains("\t\tport:\t1\n"));
        assert!(s.contains("\t\t\tGID[  0]:\t\t::ffff:127.83.86.1, RoCE v2\n"), "{s}");
        for line in [
            "\tmax_mcast_grp:\t\t\t0\n",
            "\tmax_total_mcast_qp_attach:\t0\n",
            "\tnum_comp_vectors:\t\t1\n",
            "\t\t\tport_cap_flags2:\t0x0000\n",
            "\t\t\tinit_type_reply:\t0\n",
        ] {
            assert!(s.contains(line), "missing {line:?} in\n{s}");
        }
        assert_eq!(s.matches("GID[").count(), 1, "zero GIDs are not listed");
        assert!(s.contains("\tmax_fast_reg_page_list_len:\t"), "{s}");
        assert!(s.contains("\tmax_inline_data:\t\t"), "{s}");
        assert!(s.ends_with("\n\n"));

        let quiet = render(&device(), &fake_context(), &Args::default()).expect("render");
        assert!(!quiet.contains("GID["));
        assert!(!quiet.contains("max_qp"));

        let bad_port = Args {
            port: Some(2),
            ..Args::default()
        };
        let err = render(&device(), &fake_context(), &bad_port).unwrap_err();
        assert_eq!(err.exit_status(), 1);
        assert!(err.to_string().contains("port 2 does not exist"), "{err}");
    }

    #[test]
    fn soft_counters_in_verbose_output() {
        let mut s = String::new();
        soft_lines(&mut s, &device());
        assert!(s.contains("\tsoft_link:\t\t\tinproc\n"), "{s}");
        assert!(s.contains("\tsoft_engine:\t\t\tinline\n"), "{s}");
        assert!(s.contains("\t\trx_bad_icrc:\t\t"), "{s}");
        assert!(s.contains("\t\trx_bad_source:\t\t"), "{s}");
    }

    #[test]
    fn flag_names() {
        let f = DeviceCapFlags::RESIZE_MAX_WR | DeviceCapFlags::MEM_WINDOW;
        assert_eq!(cap_flag_names(f), ["RESIZE_MAX_WR", "MEM_WINDOW"]);
        let unknown = DeviceCapFlags::from_bits_retain(1 << 40 | 1);
        assert_eq!(
            cap_flag_names(unknown),
            ["RESIZE_MAX_WR", "Unknown flags: 0x10000000000"]
        );
    }

    #[test]
    fn encodings() {
        assert_eq!(speed_str(32), "25.0 Gbps");
        assert_eq!(speed_str(3), "invalid speed");
        assert_eq!(width_str(2), "4");
        assert_eq!(vl_str(0), "invalid value");
        assert_eq!(atomic_cap_str(None), "invalid atomic capability");
        assert_eq!(link_layer_str(LinkLayer::Unspecified), "InfiniBand");
    }
}
