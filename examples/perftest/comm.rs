//! perftest's side channel (`struct perftest_comm`): the exchanges of versions, system data, MTU,
//! QP keys and reports. Without `-R` it is a TCP connection and keys travel as text; with `-R` it
//! is an RC connection made with rdma_cm, each message one SEND into a 56-byte receive buffer,
//! and keys travel as perftest's binary `struct pingpong_dest` in network byte order.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use softrdma::rdma_cm::{CmId, ConnParam, EventChannel, EventType, PortSpace};
use softrdma::verbs::{AccessFlags, QpCaps, SendFlags, SendOp, Sge, WcOpcode, WcStatus};
use softrdma::verbs::{
    CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpInitAttr, QpType, QueuePair,
    RecvWr, SendWr, WorkCompletion,
};

/// The key message with a GID: `%04x:%04x:%06x:%06x:%08x:%016llx:` + 16 `%02x:` + `%08x:` + NUL.
const KEY_MSG_SIZE_GID: usize = 108;
/// `sizeof(struct pingpong_dest)` on x86-64: 5 ints, 4 bytes of padding, u64, 16-byte GID, 2 ints.
pub const DEST_LEN: usize = 56;
/// Bound on each wait of the rdma_cm side channel.
const WAIT: Duration = Duration::from_secs(60);

/// One peer's connection data (perftest's `struct pingpong_dest`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Dest {
    pub lid: u16,
    pub out_reads: u32,
    pub qpn: u32,
    pub psn: u32,
    pub rkey: u32,
    pub vaddr: u64,
    pub gid: [u8; 16],
    pub srqn: u32,
}

fn key_msg(d: &Dest) -> [u8; KEY_MSG_SIZE_GID] {
    let mut s = format!(
        "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}",
        d.lid, d.out_reads, d.qpn, d.psn, d.rkey, d.vaddr
    );
    for b in d.gid {
        s.push_str(&format!(":{b:02x}"));
    }
    s.push_str(&format!(":{:08x}:", d.srqn));
    let mut m = [0u8; KEY_MSG_SIZE_GID];
    m[..s.len()].copy_from_slice(s.as_bytes());
    m
}

fn parse_key_msg(m: &[u8]) -> Option<Dest> {
    let end = m.iter().position(|&b| b == 0).unwrap_or(m.len());
    let s = std::str::from_utf8(&m[..end]).ok()?;
    let f: Vec<&str> = s.split(':').collect();
    if f.len() < 23 {
        return None;
    }
    let hex = |i: usize| u64::from_str_radix(f[i], 16).ok();
    let mut gid = [0u8; 16];
    for (k, g) in gid.iter_mut().enumerate() {
        *g = hex(6 + k)? as u8;
    }
    Some(Dest {
        lid: hex(0)? as u16,
        out_reads: hex(1)? as u32,
        qpn: hex(2)? as u32,
        psn: hex(3)? as u32,
        rkey: hex(4)? as u32,
        vaddr: hex(5)?,
        gid,
        srqn: hex(22)? as u32,
    })
}

/// `rdma_write_keys`: the struct with every integer in network byte order.
fn key_bin(d: &Dest, gid_index: u32) -> [u8; DEST_LEN] {
    let mut m = [0u8; DEST_LEN];
    m[0..4].copy_from_slice(&(d.lid as u32).to_be_bytes());
    m[4..8].copy_from_slice(&d.out_reads.to_be_bytes());
    m[8..12].copy_from_slice(&d.qpn.to_be_bytes());
    m[12..16].copy_from_slice(&d.psn.to_be_bytes());
    m[16..20].copy_from_slice(&d.rkey.to_be_bytes());
    m[24..32].copy_from_slice(&d.vaddr.to_be_bytes());
    m[32..48].copy_from_slice(&d.gid);
    m[48..52].copy_from_slice(&d.srqn.to_be_bytes());
    m[52..56].copy_from_slice(&gid_index.to_be_bytes());
    m
}

fn parse_key_bin(m: &[u8; DEST_LEN]) -> Dest {
    let u = |i: usize| u32::from_be_bytes(m[i..i + 4].try_into().expect("4 bytes"));
    Dest {
        lid: u(0) as u16,
        out_reads: u(4),
        qpn: u(8),
        psn: u(12),
        rkey: u(16),
        vaddr: u64::from_be_bytes(m[24..32].try_into().expect("8 bytes")),
        gid: m[32..48].try_into().expect("16 bytes"),
        srqn: u(48),
    }
}

/// The rdma_cm side channel: one RC QP, one receive of [`DEST_LEN`] bytes always posted.
pub struct CmLink {
    _ch: EventChannel,
    id: CmId,
    _pd: ProtectionDomain,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    qp: QueuePair,
    /// `[0, 64)`: the receive buffer; `[64, 128)`: the send buffer.
    mr: MemoryRegion,
}

enum Link {
    Tcp(TcpStream),
    Cm(CmLink),
}

pub struct Comm {
    link: Link,
    pub client: bool,
}

/// Wait for an event of type `want` (errors, with the event's name, otherwise).
pub fn expect_event(
    ch: &EventChannel,
    want: EventType,
) -> Result<softrdma::rdma_cm::CmEvent, String> {
    let ev = ch
        .get_cm_event_timeout(WAIT)
        .ok_or_else(|| format!("no {want} in time"))?;
    if ev.event() != want {
        return Err(format!(
            "unexpected CM event {} (status {}), wanted {want}",
            ev.event(),
            ev.status()
        ));
    }
    Ok(ev)
}

/// Client: resolve `host:port` on `id` (ADDR_RESOLVED, ROUTE_RESOLVED).
pub fn resolve(ch: &EventChannel, id: &CmId, host: &str, port: u16) -> Result<(), String> {
    let dst = SocketAddr::V4(SocketAddrV4::new(crate::getopt::ipv4_of(host)?, port));
    id.resolve_addr(None, dst, Duration::from_millis(2000))
        .map_err(|e| format!("rdma_resolve_addr failed: {e}"))?;
    expect_event(ch, EventType::AddrResolved)?;
    id.resolve_route(Duration::from_millis(2000))
        .map_err(|e| format!("rdma_resolve_route failed: {e}"))?;
    expect_event(ch, EventType::RouteResolved)?;
    Ok(())
}

/// Server: wait on `0.0.0.0:port` for one connection request; the listener is destroyed after
/// it, as perftest does. Returns the new id.
pub fn accept_one(ch: &EventChannel, port: u16) -> Result<CmId, String> {
    let listen = ch
        .create_id(PortSpace::Tcp)
        .map_err(|e| format!("rdma_create_id: {e}"))?;
    listen
        .bind_addr(SocketAddr::V4(SocketAddrV4::new(
            Ipv4Addr::UNSPECIFIED,
            port,
        )))
        .map_err(|e| format!(" rdma_bind_addr failed: {e}"))?;
    listen
        .listen(1)
        .map_err(|e| format!("rdma_listen failed: {e}"))?;
    let ev = expect_event(ch, EventType::ConnectRequest)?;
    let id = ev.id().clone();
    drop(ev);
    listen.destroy();
    Ok(id)
}

fn qp_caps(send: u32, recv: u32) -> QpCaps {
    QpCaps {
        max_send_wr: send,
        max_recv_wr: recv,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

impl CmLink {
    /// PD, CQs, QP and buffer on `id`'s device, with the first receive posted.
    fn setup(ch: EventChannel, id: CmId) -> Result<CmLink, String> {
        let ctx = id.context().ok_or("the id has no device")?;
        let pd = ctx.alloc_pd().map_err(|e| format!("alloc_pd: {e}"))?;
        let send_cq = ctx
            .create_cq(2, None)
            .map_err(|e| format!("create_cq: {e}"))?;
        let recv_cq = ctx
            .create_cq(2, None)
            .map_err(|e| format!("create_cq: {e}"))?;
        let qp = id
            .create_qp(
                &pd,
                &QpInitAttr {
                    send_cq: &send_cq,
                    recv_cq: &recv_cq,
                    cap: qp_caps(1, 1),
                    qp_type: QpType::Rc,
                    sq_sig_all: false,
                    srq: None,
                },
            )
            .map_err(|e| format!("rdma_create_qp: {e}"))?;
        let mr = pd
            .alloc_mr(128, AccessFlags::LOCAL_WRITE)
            .map_err(|e| format!("reg_mr: {e}"))?;
        let l = CmLink {
            _ch: ch,
            id,
            _pd: pd,
            send_cq,
            recv_cq,
            qp,
            mr,
        };
        l.post_recv()?;
        Ok(l)
    }

    fn post_recv(&self) -> Result<(), String> {
        self.qp
            .post_recv(&[RecvWr {
                wr_id: 0,
                sg_list: &[Sge {
                    addr: self.mr.addr(),
                    length: DEST_LEN as u32,
                    lkey: self.mr.lkey(),
                }],
            }])
            .map_err(|e| format!("Function ibv_post_recv failed for RDMA_CM QP: {e}"))
    }

    fn wait(cq: &CompletionQueue) -> Result<WorkCompletion, String> {
        let t0 = Instant::now();
        let mut wc = [WorkCompletion::default()];
        loop {
            if cq.poll(&mut wc).map_err(|e| e.to_string())? == 1 {
                return Ok(wc[0]);
            }
            if t0.elapsed() > WAIT {
                return Err("the side channel's peer went quiet".into());
            }
        }
    }

    /// `rdma_write_data`: one signaled SEND.
    fn write(&self, data: &[u8]) -> Result<(), String> {
        self.mr.write(64, data).map_err(|e| e.to_string())?;
        self.qp
            .post_send(&[SendWr {
                wr_id: 0,
                op: SendOp::Send,
                sg_list: &[Sge {
                    addr: self.mr.addr() + 64,
                    length: data.len() as u32,
                    lkey: self.mr.lkey(),
                }],
                flags: SendFlags::SIGNALED,
            }])
            .map_err(|e| format!("Function ibv_post_send failed: {e}"))?;
        let wc = Self::wait(&self.send_cq)?;
        if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Send {
            return Err(format!(" Bad wc status {:?}", wc.status));
        }
        Ok(())
    }

    /// `rdma_read_data`: the next RECV, then a new receive posted.
    fn read(&self, out: &mut [u8]) -> Result<(), String> {
        let wc = Self::wait(&self.recv_cq)?;
        if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Recv {
            return Err(format!("Bad wc status -- {:?}", wc.status));
        }
        self.mr.read(0, out).map_err(|e| e.to_string())?;
        self.post_recv()
    }
}

impl Comm {
    /// Client without `-R`: a TCP connection to `host:port`.
    pub fn tcp_client(host: &str, port: u16) -> Result<Comm, String> {
        let s = TcpStream::connect((host, port))
            .map_err(|e| format!("Couldn't connect to {host}:{port}: {e}"))?;
        let _ = s.set_nodelay(true);
        Ok(Comm {
            link: Link::Tcp(s),
            client: true,
        })
    }

    /// Server without `-R`: accept one TCP connection on `port`.
    pub fn tcp_server(port: u16) -> Result<Comm, String> {
        let l = TcpListener::bind(("0.0.0.0", port))
            .map_err(|e| format!("Couldn't listen to port {port}: {e}"))?;
        let (s, _) = l.accept().map_err(|e| format!("accept() failed: {e}"))?;
        let _ = s.set_nodelay(true);
        Ok(Comm {
            link: Link::Tcp(s),
            client: false,
        })
    }

    /// Client with `-R` (`rdma_client_connect`): connect an RC QP to `host:port` with rdma_cm.
    pub fn cm_client(host: &str, port: u16, conn: &ConnParam) -> Result<Comm, String> {
        let ch = EventChannel::new().map_err(|e| e.to_string())?;
        let id = ch
            .create_id(PortSpace::Tcp)
            .map_err(|e| format!("rdma_create_id: {e}"))?;
        resolve(&ch, &id, host, port)?;
        let link = CmLink::setup(ch, id.clone())?;
        id.connect(conn)
            .map_err(|e| format!("Function rdma_connect failed: {e}"))?;
        expect_event(&link._ch, EventType::Established)?;
        Ok(Comm {
            link: Link::Cm(link),
            client: true,
        })
    }

    /// Server with `-R` (`rdma_server_connect`): accept one rdma_cm connection on `port`.
    pub fn cm_server(port: u16, conn: &ConnParam) -> Result<Comm, String> {
        let ch = EventChannel::new().map_err(|e| e.to_string())?;
        let id = accept_one(&ch, port)?;
        let link = CmLink::setup(ch, id.clone())?;
        id.accept(conn)
            .map_err(|e| format!("Function rdma_accept failed: {e}"))?;
        Ok(Comm {
            link: Link::Cm(link),
            client: false,
        })
    }

    /// The device the rdma_cm side channel runs on (`-R`): the test's resources go there too.
    pub fn context(&self) -> Option<Context> {
        match &self.link {
            Link::Cm(l) => l.id.context(),
            Link::Tcp(_) => None,
        }
    }

    fn write(&mut self, data: &[u8]) -> Result<(), String> {
        match &mut self.link {
            Link::Tcp(s) => s
                .write_all(data)
                .map_err(|e| format!("exchange: write: {e}")),
            Link::Cm(l) => l.write(data),
        }
    }

    fn read(&mut self, out: &mut [u8]) -> Result<(), String> {
        match &mut self.link {
            Link::Tcp(s) => s
                .read_exact(out)
                .map_err(|e| format!("exchange: read: {e}")),
            Link::Cm(l) => l.read(out),
        }
    }

    /// perftest's `ctx_xchg_data`: the client writes then reads, the server reads then writes.
    pub fn xchg(&mut self, mine: &[u8], theirs: &mut [u8]) -> Result<(), String> {
        if self.client {
            self.write(mine)?;
            self.read(theirs)
        } else {
            self.read(theirs)?;
            self.write(mine)
        }
    }

    /// perftest's `ctx_hand_shake`: one exchange of the key message.
    pub fn hand_shake(&mut self, my: &Dest) -> Result<Dest, String> {
        if matches!(self.link, Link::Cm(_)) {
            let mut rem = [0u8; DEST_LEN];
            self.xchg(&key_bin(my, 0), &mut rem)?;
            return Ok(parse_key_bin(&rem));
        }
        let mut rem = [0u8; KEY_MSG_SIZE_GID];
        self.xchg(&key_msg(my), &mut rem)?;
        parse_key_msg(&rem).ok_or_else(|| {
            let end = rem.iter().position(|&b| b == 0).unwrap_or(rem.len());
            format!(
                "Couldn't parse line <{}>",
                String::from_utf8_lossy(&rem[..end])
            )
        })
    }

    /// perftest's `ctx_close_connection`: a last handshake, then (TCP) `"done\0"` or (rdma_cm)
    /// a disconnect.
    pub fn close(mut self, my: &Dest) -> Result<(), String> {
        self.hand_shake(my)?;
        match self.link {
            Link::Tcp(mut s) => {
                s.write_all(b"done\0").map_err(|e| format!("close: {e}"))?;
                // Consume the peer's "done" (best effort) so closing does not reset the link.
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let mut b = [0u8; 5];
                let _ = s.read_exact(&mut b);
            }
            Link::Cm(l) => disconnect(&l._ch, &l.id),
        }
        Ok(())
    }
}

/// Disconnect `id` and give the peer a moment to answer (either side may go first).
pub fn disconnect(ch: &EventChannel, id: &CmId) {
    let _ = id.disconnect();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2) {
        match ch.get_cm_event_timeout(Duration::from_millis(100)) {
            Some(ev) if ev.event() == EventType::Disconnected && ev.id() == id => return,
            _ => {}
        }
    }
}
