//! What the seed's (001) rdma_cm server and client share: the per-device context (PD,
//! completion channel, CQ and the thread that polls it), a connection's QP and buffers, and
//! the completion handler.

use std::sync::{Arc, Mutex};

use softrdma::rdma_cm::{CmId, ConnParam};
use softrdma::verbs::{AccessFlags, QpCaps, SendFlags, SendOp, Sge, WcOpcode, WcStatus};
use softrdma::verbs::{
    CompletionChannel, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpInitAttr,
    QpType, QueuePair, RecvWr, SendWr, WorkCompletion,
};

pub const BUFFER_SIZE: usize = 1024;

/// `die`: the message on stderr, exit status 1.
pub fn die(reason: &str) -> ! {
    eprintln!("{reason}");
    std::process::exit(1);
}

/// `struct connection`: the QP and the two registered regions of one connection.
pub struct Connection {
    pub id: CmId,
    pub qp: QueuePair,
    pub recv_mr: MemoryRegion,
    pub send_mr: MemoryRegion,
    /// Completions seen (the client disconnects after its send and its receive).
    pub completions: u32,
}

/// `struct context`: one per device, with the thread that polls the CQ.
#[allow(dead_code)] // the client never compares devices
pub struct DevContext {
    pub ctx: Context,
    pub pd: ProtectionDomain,
    pub cq: CompletionQueue,
}

/// `build_context`: PD, completion channel, CQ (10 entries) armed, and the CQ poller thread,
/// which hands each completion to `on_completion`.
pub fn build_context(
    ctx: Context,
    on_completion: impl Fn(&WorkCompletion) + Send + 'static,
) -> DevContext {
    let pd = ctx
        .alloc_pd()
        .unwrap_or_else(|_| die("error: ibv_alloc_pd failed"));
    let channel: CompletionChannel = ctx
        .create_comp_channel()
        .unwrap_or_else(|_| die("error: ibv_create_comp_channel failed"));
    let cq = ctx
        .create_cq(10, Some(&channel))
        .unwrap_or_else(|_| die("error: ibv_create_cq failed"));
    cq.req_notify(false)
        .unwrap_or_else(|_| die("error: ibv_req_notify_cq failed"));
    let poll_cq = cq.clone();
    std::thread::spawn(move || loop {
        // poll_cq: wait for an event, re-arm, drain.
        let Ok(cq) = channel.get_cq_event() else {
            die("error: ibv_get_cq_event failed");
        };
        cq.ack_events(1);
        if cq.req_notify(false).is_err() {
            die("error: ibv_req_notify_cq failed");
        }
        let mut wc = [WorkCompletion::default()];
        while let Ok(1) = poll_cq.poll(&mut wc) {
            on_completion(&wc[0]);
        }
    });
    DevContext { ctx, pd, cq }
}

/// `build_qp_attr` + `rdma_create_qp` + `register_memory` + `post_receives`.
pub fn build_connection(s: &DevContext, id: &CmId) -> Connection {
    let qp = id
        .create_qp(
            &s.pd,
            &QpInitAttr {
                send_cq: &s.cq,
                recv_cq: &s.cq,
                cap: QpCaps {
                    max_send_wr: 10,
                    max_recv_wr: 10,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: QpType::Rc,
                sq_sig_all: false,
                srq: None,
            },
        )
        .unwrap_or_else(|e| die(&format!("error: rdma_create_qp failed: {e}")));
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let send_mr =
        s.pd.alloc_mr(BUFFER_SIZE, rw)
            .unwrap_or_else(|_| die("error: ibv_reg_mr failed"));
    let recv_mr =
        s.pd.alloc_mr(BUFFER_SIZE, rw)
            .unwrap_or_else(|_| die("error: ibv_reg_mr failed"));
    qp.post_recv(&[RecvWr {
        wr_id: 0,
        sg_list: &[Sge {
            addr: recv_mr.addr(),
            length: BUFFER_SIZE as u32,
            lkey: recv_mr.lkey(),
        }],
    }])
    .unwrap_or_else(|_| die("error: ibv_post_recv failed"));
    Connection {
        id: id.clone(),
        qp,
        recv_mr,
        send_mr,
        completions: 0,
    }
}

/// `on_connection`: write the message and post a signaled SEND of it (NUL included).
pub fn post_send_message(conn: &Connection, msg: &str) {
    println!("connected. posting send...");
    let mut b = msg.as_bytes().to_vec();
    b.push(0);
    b.truncate(BUFFER_SIZE);
    conn.send_mr
        .write(0, &b)
        .unwrap_or_else(|_| die("error: write failed"));
    conn.qp
        .post_send(&[SendWr {
            wr_id: 0,
            op: SendOp::Send,
            sg_list: &[Sge {
                addr: conn.send_mr.addr(),
                length: BUFFER_SIZE as u32,
                lkey: conn.send_mr.lkey(),
            }],
            flags: SendFlags::SIGNALED,
        }])
        .unwrap_or_else(|_| die("error: ibv_post_send failed"));
}

/// `on_completion` for one connection: print what came, count it. Returns the new count.
pub fn on_completion(conn: &Mutex<Option<Connection>>, wc: &WorkCompletion) -> u32 {
    if wc.status != WcStatus::Success {
        die("on_completion: status is not IBV_WC_SUCCESS.");
    }
    let mut g = conn.lock().unwrap_or_else(|p| p.into_inner());
    let Some(c) = g.as_mut() else { return 0 };
    match wc.opcode {
        WcOpcode::Recv => {
            let mut b = vec![0u8; BUFFER_SIZE];
            let _ = c.recv_mr.read(0, &mut b);
            let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
            println!("received message: {}", String::from_utf8_lossy(&b[..end]));
        }
        WcOpcode::Send => println!("send completed successfully."),
        _ => die("on_completion: completion isn't a send or a receive."),
    }
    c.completions += 1;
    c.completions
}

/// The seed's `cm_params`: memset to 0, then these (as `build_params`).
pub fn cm_params() -> ConnParam {
    ConnParam {
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    }
}

/// A connection slot the CQ thread and the event loop share.
pub type Shared = Arc<Mutex<Option<Connection>>>;
