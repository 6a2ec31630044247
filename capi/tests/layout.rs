//! The C structures softrdma hands to programs have exactly the layout of the installed
//! rdma-core headers: a C program compiled against `<infiniband/verbs.h>` and
//! `<rdma/rdma_cma.h>` prints each structure's size and field offsets, and they must equal
//! those of the bindgen definitions the library is built from (`src/abi_gen.rs`, included
//! here as it is in the library).

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    clippy::all
)]
mod abi {
    include!("../src/abi_gen.rs");
}

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};

/// (C struct name, [(field, offset)], size) for each structure, from the Rust definitions.
macro_rules! layouts {
    ($($s:ident { $($f:ident),* $(,)? })*) => {
        vec![$((
            stringify!($s),
            vec![$((stringify!($f), offset_of!(abi::$s, $f))),*],
            size_of::<abi::$s>(),
        )),*]
    };
}

mod util;

#[test]
fn structures_match_the_system_headers() {
    if !util::have_headers() {
        return;
    }
    let rust = layouts! {
        ibv_device { node_type, transport_type, name, dev_name, dev_path, ibdev_path }
        ibv_context { device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat }
        ibv_context_ops { poll_cq, req_notify_cq, post_srq_recv, post_send, post_recv, alloc_mw, bind_mw, dealloc_mw }
        verbs_context { query_port, create_cq_ex, query_device_ex, create_qp_ex, open_xrcd, sz, context }
        ibv_device_attr { fw_ver, node_guid, max_mr_size, max_qp, max_cqe, atomic_cap, max_srq, max_pkeys, phys_port_cnt }
        ibv_device_attr_ex { orig_attr, comp_mask, odp_caps, max_dm_size }
        ibv_port_attr { state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, pkey_tbl_len, lid, link_layer, flags, port_cap_flags2 }
        ibv_gid_entry { gid, gid_index, port_num, gid_type, ndev_ifindex }
        ibv_pd { context, handle }
        ibv_mr { context, pd, addr, length, handle, lkey, rkey }
        ibv_comp_channel { context, fd, refcnt }
        ibv_cq { context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed, async_events_completed }
        ibv_wc { wr_id, status, opcode, vendor_err, byte_len, qp_num, src_qp, wc_flags, pkey_index, slid, sl, dlid_path_bits }
        ibv_sge { addr, length, lkey }
        ibv_send_wr { wr_id, next, sg_list, num_sge, opcode, send_flags, wr }
        ibv_recv_wr { wr_id, next, sg_list, num_sge }
        ibv_qp { context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type, mutex, cond, events_completed }
        ibv_qp_ex { qp_base, comp_mask, wr_id, wr_flags, wr_atomic_cmp_swp, wr_send, wr_set_sge, wr_start, wr_complete, wr_abort }
        ibv_qp_cap { max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data }
        ibv_qp_init_attr { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all }
        ibv_qp_init_attr_ex { qp_context, cap, qp_type, comp_mask, pd, create_flags, send_ops_flags }
        ibv_qp_attr { qp_state, path_mtu, qkey, rq_psn, sq_psn, dest_qp_num, qp_access_flags, cap, ah_attr, pkey_index, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry, rate_limit }
        ibv_ah_attr { grh, dlid, sl, src_path_bits, static_rate, is_global, port_num }
        ibv_global_route { dgid, flow_label, sgid_index, hop_limit, traffic_class }
        ibv_ah { context, pd, handle }
        ibv_srq { context, srq_context, pd, handle, mutex, cond, events_completed }
        ibv_srq_attr { max_wr, max_sge, srq_limit }
        ibv_async_event { element, event_type }
        rdma_cm_id { verbs, channel, context, qp, route, ps, port_num, event, send_cq_channel, send_cq, recv_cq_channel, recv_cq, srq, pd, qp_type }
        rdma_cm_event { id, listen_id, event, status, param }
        rdma_conn_param { private_data, private_data_len, responder_resources, initiator_depth, flow_control, retry_count, rnr_retry_count, srq, qp_num }
        rdma_ud_param { private_data, private_data_len, ah_attr, qp_num, qkey }
        rdma_route { addr, path_rec, num_paths }
        rdma_addrinfo { ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len, ai_dst_len, ai_src_addr, ai_dst_addr, ai_src_canonname, ai_dst_canonname, ai_route_len, ai_route, ai_connect_len, ai_connect, ai_next }
        rdma_event_channel { fd }
    };

    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\n#include <rdma/rdma_cma.h>\nint main(void) {\n",
    );
    for (s, fields, _) in &rust {
        c += &format!("printf(\"{s} %zu\\n\", sizeof(struct {s}));\n");
        for (f, _) in fields {
            c += &format!("printf(\"{s}.{f} %zu\\n\", offsetof(struct {s}, {f}));\n");
        }
    }
    c += "return 0; }\n";
    let dir = std::env::temp_dir().join(format!("softrdma-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c).unwrap();
    let cc = std::process::Command::new("cc")
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("a C compiler (cc) runs");
    assert!(
        cc.status.success(),
        "compiling against the system headers failed (install libibverbs-dev and librdmacm-dev):\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = std::process::Command::new(&exe)
        .output()
        .expect("layout runs");
    let c_values: BTreeMap<String, usize> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);

    let mut checked = 0;
    let mut wrong = Vec::new();
    for (s, fields, size) in &rust {
        let mut check = |key: String, ours: usize| {
            checked += 1;
            match c_values.get(&key) {
                Some(&theirs) if theirs == ours => {}
                other => wrong.push(format!("{key}: C {other:?}, Rust {ours}")),
            }
        };
        check(s.to_string(), *size);
        for (f, off) in fields {
            check(format!("{s}.{f}"), *off);
        }
    }
    assert!(wrong.is_empty(), "layouts differ: {wrong:#?}");
    assert!(checked > 200, "checked {checked} sizes and offsets");
}
