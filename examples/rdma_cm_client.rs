//! The seed's (001) rdma_cm client, in Rust: `rdma_cm_client <server-address> <server-port>`.
//! Resolve the address (then build the QP and buffers and post a receive), resolve the route,
//! connect; on ESTABLISHED send "message from active/client side with pid N"; once its send and
//! its receive have completed, disconnect; exit on DISCONNECTED. A thread blocked on the
//! completion channel handles completions, as in the seed.

#[path = "seed001/mod.rs"]
mod seed001;

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seed001::*;
use softrdma::rdma_cm::{EventChannel, EventType, PortSpace};

const TIMEOUT_IN_MS: u64 = 500;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        die("usage: client <server-address> <server-port>");
    }
    let addr: SocketAddr = format!("{}:{}", args[1], args[2])
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.find(|a| a.is_ipv4()))
        .unwrap_or_else(|| die("error: getaddrinfo failed"));
    let ec = EventChannel::new().unwrap_or_else(|_| die("error: rdma_create_event_channel failed"));
    let conn_id = ec
        .create_id(PortSpace::Tcp)
        .unwrap_or_else(|_| die("error: rdma_create_id failed"));
    conn_id
        .resolve_addr(None, addr, Duration::from_millis(TIMEOUT_IN_MS))
        .unwrap_or_else(|e| die(&format!("error: rdma_resolve_addr failed: {e}")));

    let mut s_ctx: Option<DevContext> = None;
    let conn: Shared = Arc::new(Mutex::new(None));
    while let Ok(event) = ec.get_cm_event() {
        let id = event.id().clone();
        let kind = event.event();
        let status = event.status();
        event.ack();
        match kind {
            EventType::AddrResolved => {
                println!("address resolved.");
                let ctx = id.context().unwrap_or_else(|| die("no device"));
                let s = s_ctx.get_or_insert_with(|| {
                    let c = conn.clone();
                    build_context(ctx, move |wc| {
                        // After the send and the receive: disconnect (from this thread, as the
                        // seed does from its poller).
                        if on_completion(&c, wc) == 2 {
                            if let Some(c) = c.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                                let _ = c.id.disconnect();
                            }
                        }
                    })
                });
                *conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(build_connection(s, &id));
                id.resolve_route(Duration::from_millis(TIMEOUT_IN_MS))
                    .unwrap_or_else(|e| die(&format!("error: rdma_resolve_route failed: {e}")));
            }
            EventType::RouteResolved => {
                println!("route resolved.");
                id.connect(&cm_params())
                    .unwrap_or_else(|e| die(&format!("error: rdma_connect failed: {e}")));
            }
            EventType::Established => {
                let g = conn.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(c) = g.as_ref() {
                    let msg = format!(
                        "message from active/client side with pid {}",
                        std::process::id()
                    );
                    post_send_message(c, &msg);
                }
            }
            EventType::Disconnected => {
                println!("disconnected.");
                if let Some(c) = conn.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    c.id.destroy();
                }
                break;
            }
            other => die(&format!(
                "on_event: unexpected event {other} (status {status})."
            )),
        }
    }
}
