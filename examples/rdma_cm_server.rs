//! The seed's (001) rdma_cm server, in Rust: bind to any address on an ephemeral port, listen,
//! print the port; for each client: on CONNECT_REQUEST build the QP and buffers, post a receive
//! and accept; on ESTABLISHED send "message from passive/server side with pid N"; print what
//! arrives; on DISCONNECTED clean up. Completions are handled by a thread blocked on the
//! completion channel, as in the seed.
//!
//! ```text
//! cargo run --example rdma_cm_server            # prints "listening on port N."
//! cargo run --example rdma_cm_client 127.0.0.1 N  # in another terminal
//! ```
//! With `--once` the server exits after its first client disconnected, and `--addr A` binds
//! address A instead of any (both used by the tests).

#[path = "seed001/mod.rs"]
mod seed001;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};

use seed001::*;
use softrdma::rdma_cm::{EventChannel, EventType, PortSpace};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let once = args.iter().any(|a| a == "--once");
    let ip: Ipv4Addr = args
        .iter()
        .position(|a| a == "--addr")
        .and_then(|i| args.get(i + 1))
        .map(|a| {
            a.parse()
                .unwrap_or_else(|_| die("--addr: not an IPv4 address"))
        })
        .unwrap_or(Ipv4Addr::UNSPECIFIED);
    let ec = EventChannel::new().unwrap_or_else(|_| die("error: rdma_create_event_channel failed"));
    let listener = ec
        .create_id(PortSpace::Tcp)
        .unwrap_or_else(|_| die("error: rdma_create_id failed"));
    listener
        .bind_addr(SocketAddr::V4(SocketAddrV4::new(ip, 0)))
        .unwrap_or_else(|e| die(&format!("error: rdma_bind_addr failed: {e}")));
    listener
        .listen(10) // backlog=10 is arbitrary
        .unwrap_or_else(|e| die(&format!("error: rdma_listen failed: {e}")));
    let port = listener.local_addr().map_or(0, |a| a.port());
    println!("listening on port {port}.");

    let mut s_ctx: Option<DevContext> = None;
    let conn: Shared = Arc::new(Mutex::new(None));
    while let Ok(event) = ec.get_cm_event() {
        let id = event.id().clone();
        let kind = event.event();
        event.ack();
        match kind {
            EventType::ConnectRequest => {
                println!("received connection request.");
                let ctx = id.context().unwrap_or_else(|| die("no device"));
                if s_ctx
                    .as_ref()
                    .is_some_and(|s| s.ctx.node_guid() != ctx.node_guid())
                {
                    die("cannot handle events in more than one context.");
                }
                let s = s_ctx.get_or_insert_with(|| {
                    let c = conn.clone();
                    build_context(ctx, move |wc| {
                        on_completion(&c, wc);
                    })
                });
                *conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(build_connection(s, &id));
                id.accept(&cm_params())
                    .unwrap_or_else(|e| die(&format!("error: rdma_accept failed: {e}")));
            }
            EventType::Established => {
                let g = conn.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(c) = g.as_ref() {
                    let msg = format!(
                        "message from passive/server side with pid {}",
                        std::process::id()
                    );
                    post_send_message(c, &msg);
                }
            }
            EventType::Disconnected => {
                println!("peer disconnected.");
                if once {
                    // Let the completion thread report this connection's send and receive
                    // before the process ends (bounded).
                    let t0 = std::time::Instant::now();
                    while conn
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .as_ref()
                        .is_some_and(|c| c.completions < 2)
                        && t0.elapsed() < std::time::Duration::from_secs(5)
                    {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                }
                let c = conn.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(c) = c {
                    let _ = c.id.disconnect();
                    c.id.destroy();
                }
                if once {
                    break;
                }
            }
            EventType::TimewaitExit => {}
            other => die(&format!("on_event: unknown event {other}.")),
        }
    }
    listener.destroy();
}
