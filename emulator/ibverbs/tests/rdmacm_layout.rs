//! The Rust definitions of `softverbs_ibverbs::rdmacm::ffi` against the
//! system's `rdma/rdma_cma.h` (rdma-core 44): `rdmacm_layout.c` is
//! compiled with `cc` and prints the size, alignment and every field
//! offset; each must equal the Rust value. Skips (with a SKIP line) where
//! `cc` or the header is missing (Debian: `apt-get install librdmacm-dev`).

use std::collections::BTreeMap;
use std::mem::{align_of, offset_of, size_of};
use std::path::Path;
use std::process::Command;

use softverbs_ibverbs::rdmacm::ffi::*;

fn rust_layout() -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    m.insert("rdma_ib_addr size".into(), size_of::<rdma_ib_addr>());
    m.insert("rdma_ib_addr align".into(), align_of::<rdma_ib_addr>());
    m.insert("rdma_ib_addr sgid".into(), offset_of!(rdma_ib_addr, sgid));
    m.insert("rdma_ib_addr dgid".into(), offset_of!(rdma_ib_addr, dgid));
    m.insert("rdma_ib_addr pkey".into(), offset_of!(rdma_ib_addr, pkey));
    m.insert("rdma_addr size".into(), size_of::<rdma_addr>());
    m.insert("rdma_addr align".into(), align_of::<rdma_addr>());
    m.insert("rdma_addr src_storage".into(), offset_of!(rdma_addr, src_storage));
    m.insert("rdma_addr dst_storage".into(), offset_of!(rdma_addr, dst_storage));
    m.insert("rdma_addr ibaddr".into(), offset_of!(rdma_addr, ibaddr));
    m.insert("rdma_route size".into(), size_of::<rdma_route>());
    m.insert("rdma_route align".into(), align_of::<rdma_route>());
    m.insert("rdma_route addr".into(), offset_of!(rdma_route, addr));
    m.insert("rdma_route path_rec".into(), offset_of!(rdma_route, path_rec));
    m.insert("rdma_route num_paths".into(), offset_of!(rdma_route, num_paths));
    m.insert("rdma_event_channel size".into(), size_of::<rdma_event_channel>());
    m.insert("rdma_event_channel align".into(), align_of::<rdma_event_channel>());
    m.insert("rdma_event_channel fd".into(), offset_of!(rdma_event_channel, fd));
    m.insert("rdma_cm_id size".into(), size_of::<rdma_cm_id>());
    m.insert("rdma_cm_id align".into(), align_of::<rdma_cm_id>());
    m.insert("rdma_cm_id verbs".into(), offset_of!(rdma_cm_id, verbs));
    m.insert("rdma_cm_id channel".into(), offset_of!(rdma_cm_id, channel));
    m.insert("rdma_cm_id context".into(), offset_of!(rdma_cm_id, context));
    m.insert("rdma_cm_id qp".into(), offset_of!(rdma_cm_id, qp));
    m.insert("rdma_cm_id route".into(), offset_of!(rdma_cm_id, route));
    m.insert("rdma_cm_id ps".into(), offset_of!(rdma_cm_id, ps));
    m.insert("rdma_cm_id port_num".into(), offset_of!(rdma_cm_id, port_num));
    m.insert("rdma_cm_id event".into(), offset_of!(rdma_cm_id, event));
    m.insert(
        "rdma_cm_id send_cq_channel".into(),
        offset_of!(rdma_cm_id, send_cq_channel),
    );
    m.insert("rdma_cm_id send_cq".into(), offset_of!(rdma_cm_id, send_cq));
    m.insert(
        "rdma_cm_id recv_cq_channel".into(),
        offset_of!(rdma_cm_id, recv_cq_channel),
    );
    m.insert("rdma_cm_id recv_cq".into(), offset_of!(rdma_cm_id, recv_cq));
    m.insert("rdma_cm_id srq".into(), offset_of!(rdma_cm_id, srq));
    m.insert("rdma_cm_id pd".into(), offset_of!(rdma_cm_id, pd));
    m.insert("rdma_cm_id qp_type".into(), offset_of!(rdma_cm_id, qp_type));
    m.insert("rdma_conn_param size".into(), size_of::<rdma_conn_param>());
    m.insert("rdma_conn_param align".into(), align_of::<rdma_conn_param>());
    m.insert(
        "rdma_conn_param private_data".into(),
        offset_of!(rdma_conn_param, private_data),
    );
    m.insert(
        "rdma_conn_param private_data_len".into(),
        offset_of!(rdma_conn_param, private_data_len),
    );
    m.insert(
        "rdma_conn_param responder_resources".into(),
        offset_of!(rdma_conn_param, responder_resources),
    );
    m.insert(
        "rdma_conn_param initiator_depth".into(),
        offset_of!(rdma_conn_param, initiator_depth),
    );
    m.insert(
        "rdma_conn_param flow_control".into(),
        offset_of!(rdma_conn_param, flow_control),
    );
    m.insert(
        "rdma_conn_param retry_count".into(),
        offset_of!(rdma_conn_param, retry_count),
    );
    m.insert(
        "rdma_conn_param rnr_retry_count".into(),
        offset_of!(rdma_conn_param, rnr_retry_count),
    );
    m.insert("rdma_conn_param srq".into(), offset_of!(rdma_conn_param, srq));
    m.insert("rdma_conn_param qp_num".into(), offset_of!(rdma_conn_param, qp_num));
    m.insert("rdma_ud_param size".into(), size_of::<rdma_ud_param>());
    m.insert("rdma_ud_param align".into(), align_of::<rdma_ud_param>());
    m.insert(
        "rdma_ud_param private_data".into(),
        offset_of!(rdma_ud_param, private_data),
    );
    m.insert(
        "rdma_ud_param private_data_len".into(),
        offset_of!(rdma_ud_param, private_data_len),
    );
    m.insert("rdma_ud_param ah_attr".into(), offset_of!(rdma_ud_param, ah_attr));
    m.insert("rdma_ud_param qp_num".into(), offset_of!(rdma_ud_param, qp_num));
    m.insert("rdma_ud_param qkey".into(), offset_of!(rdma_ud_param, qkey));
    m.insert("rdma_cm_event size".into(), size_of::<rdma_cm_event>());
    m.insert("rdma_cm_event align".into(), align_of::<rdma_cm_event>());
    m.insert("rdma_cm_event id".into(), offset_of!(rdma_cm_event, id));
    m.insert("rdma_cm_event listen_id".into(), offset_of!(rdma_cm_event, listen_id));
    m.insert("rdma_cm_event event".into(), offset_of!(rdma_cm_event, event));
    m.insert("rdma_cm_event status".into(), offset_of!(rdma_cm_event, status));
    m.insert("rdma_cm_event param".into(), offset_of!(rdma_cm_event, param));
    m.insert("rdma_addrinfo size".into(), size_of::<rdma_addrinfo>());
    m.insert("rdma_addrinfo align".into(), align_of::<rdma_addrinfo>());
    m.insert("rdma_addrinfo ai_flags".into(), offset_of!(rdma_addrinfo, ai_flags));
    m.insert("rdma_addrinfo ai_family".into(), offset_of!(rdma_addrinfo, ai_family));
    m.insert("rdma_addrinfo ai_qp_type".into(), offset_of!(rdma_addrinfo, ai_qp_type));
    m.insert(
        "rdma_addrinfo ai_port_space".into(),
        offset_of!(rdma_addrinfo, ai_port_space),
    );
    m.insert("rdma_addrinfo ai_src_len".into(), offset_of!(rdma_addrinfo, ai_src_len));
    m.insert("rdma_addrinfo ai_dst_len".into(), offset_of!(rdma_addrinfo, ai_dst_len));
    m.insert(
        "rdma_addrinfo ai_src_addr".into(),
        offset_of!(rdma_addrinfo, ai_src_addr),
    );
    m.insert(
        "rdma_addrinfo ai_dst_addr".into(),
        offset_of!(rdma_addrinfo, ai_dst_addr),
    );
    m.insert(
        "rdma_addrinfo ai_src_canonname".into(),
        offset_of!(rdma_addrinfo, ai_src_canonname),
    );
    m.insert(
        "rdma_addrinfo ai_dst_canonname".into(),
        offset_of!(rdma_addrinfo, ai_dst_canonname),
    );
    m.insert(
        "rdma_addrinfo ai_route_len".into(),
        offset_of!(rdma_addrinfo, ai_route_len),
    );
    m.insert("rdma_addrinfo ai_route".into(), offset_of!(rdma_addrinfo, ai_route));
    m.insert(
        "rdma_addrinfo ai_connect_len".into(),
        offset_of!(rdma_addrinfo, ai_connect_len),
    );
    m.insert("rdma_addrinfo ai_connect".into(), offset_of!(rdma_addrinfo, ai_connect));
    m.insert("rdma_addrinfo ai_next".into(), offset_of!(rdma_addrinfo, ai_next));
    m.insert("ibv_sa_path_rec size".into(), size_of::<ibv_sa_path_rec>());
    m.insert("ibv_sa_path_rec align".into(), align_of::<ibv_sa_path_rec>());
    m.insert("ibv_sa_path_rec dgid".into(), offset_of!(ibv_sa_path_rec, dgid));
    m.insert("ibv_sa_path_rec sgid".into(), offset_of!(ibv_sa_path_rec, sgid));
    m.insert("ibv_sa_path_rec dlid".into(), offset_of!(ibv_sa_path_rec, dlid));
    m.insert("ibv_sa_path_rec slid".into(), offset_of!(ibv_sa_path_rec, slid));
    m.insert(
        "ibv_sa_path_rec raw_traffic".into(),
        offset_of!(ibv_sa_path_rec, raw_traffic),
    );
    m.insert(
        "ibv_sa_path_rec flow_label".into(),
        offset_of!(ibv_sa_path_rec, flow_label),
    );
    m.insert(
        "ibv_sa_path_rec hop_limit".into(),
        offset_of!(ibv_sa_path_rec, hop_limit),
    );
    m.insert(
        "ibv_sa_path_rec traffic_class".into(),
        offset_of!(ibv_sa_path_rec, traffic_class),
    );
    m.insert(
        "ibv_sa_path_rec reversible".into(),
        offset_of!(ibv_sa_path_rec, reversible),
    );
    m.insert(
        "ibv_sa_path_rec numb_path".into(),
        offset_of!(ibv_sa_path_rec, numb_path),
    );
    m.insert("ibv_sa_path_rec pkey".into(), offset_of!(ibv_sa_path_rec, pkey));
    m.insert("ibv_sa_path_rec sl".into(), offset_of!(ibv_sa_path_rec, sl));
    m.insert(
        "ibv_sa_path_rec mtu_selector".into(),
        offset_of!(ibv_sa_path_rec, mtu_selector),
    );
    m.insert("ibv_sa_path_rec mtu".into(), offset_of!(ibv_sa_path_rec, mtu));
    m.insert(
        "ibv_sa_path_rec rate_selector".into(),
        offset_of!(ibv_sa_path_rec, rate_selector),
    );
    m.insert("ibv_sa_path_rec rate".into(), offset_of!(ibv_sa_path_rec, rate));
    m.insert(
        "ibv_sa_path_rec packet_life_time_selector".into(),
        offset_of!(ibv_sa_path_rec, packet_life_time_selector),
    );
    m.insert(
        "ibv_sa_path_rec packet_life_time".into(),
        offset_of!(ibv_sa_path_rec, packet_life_time),
    );
    m.insert(
        "ibv_sa_path_rec preference".into(),
        offset_of!(ibv_sa_path_rec, preference),
    );
    m.insert("rdma_cm_event_param size".into(), size_of::<rdma_cm_event_param>());
    m.insert("rdma_cm_event_param align".into(), align_of::<rdma_cm_event_param>());
    m
}

#[test]
fn struct_layouts_match_rdma_cma_h() {
    if !Path::new("/usr/include/rdma/rdma_cma.h").exists() {
        println!("SKIP: /usr/include/rdma/rdma_cma.h is absent (install librdmacm-dev)");
        return;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rdmacm_layout.c");
    let exe = std::env::temp_dir().join(format!("softverbs-rdmacm-layout-{}", std::process::id()));
    match Command::new("cc").arg("-o").arg(&exe).arg(&src).status() {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("cc failed on rdmacm_layout.c: {s}"),
        Err(e) => {
            println!("SKIP: no C compiler ({e})");
            return;
        }
    }
    let out = Command::new(&exe).output().expect("run the layout program");
    let _ = std::fs::remove_file(&exe);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut c: BTreeMap<String, usize> = BTreeMap::new();
    for line in text.lines() {
        // "struct field N" or "struct size N align M"
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 5 && f[1] == "size" {
            c.insert(format!("{} size", f[0]), f[2].parse().unwrap());
            c.insert(format!("{} align", f[0]), f[4].parse().unwrap());
        } else {
            assert_eq!(f.len(), 3, "unexpected line {line:?}");
            c.insert(format!("{} {}", f[0], f[1]), f[2].parse().unwrap());
        }
    }
    let rust = rust_layout();
    let bad: Vec<String> = rust
        .iter()
        .filter_map(|(k, v)| match c.get(k) {
            Some(cv) if cv == v => None,
            Some(cv) => Some(format!("{k}: C {cv}, Rust {v}")),
            None => Some(format!("{k}: not printed by rdmacm_layout.c")),
        })
        .collect();
    assert!(bad.is_empty(), "layout mismatches:\n{}", bad.join("\n"));
    assert_eq!(rust.len(), c.len(), "every C entry is checked");
    println!("{} sizes and offsets match rdma_cma.h", rust.len());
}
