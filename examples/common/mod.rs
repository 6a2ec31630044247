//! Code shared by the seed ports (`send_recv`, `rdma_rw`, `epoll_loop`): the out-of-band TCP
//! exchange of QPN/PSN/GID (and buffer address and rkey), endpoint setup, QP connection and
//! bounded completion polling. Not every example uses every piece.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use softrdma::verbs::{
    AccessFlags, AddressVector, CompletionChannel, CompletionQueue, Context, MemoryRegion, Mtu,
    ProtectionDomain, QpAttr, QpCaps, QpInitAttr, QpState, QpType, QueuePair, RecvWr, SendFlags,
    SendOp, SendWr, Sge, WcStatus, WorkCompletion,
};

pub type Res<T> = Result<T, String>;

/// What each side tells the other over TCP.
#[derive(Clone, Copy, Debug)]
pub struct PeerInfo {
    pub qpn: u32,
    pub psn: u32,
    pub gid: [u8; 16],
    pub addr: u64,
    pub rkey: u32,
    /// Client → server: how many messages will follow (0 when unused).
    pub n: u32,
}

impl PeerInfo {
    pub fn encode(&self) -> String {
        let gid: String = self.gid.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "{:06x}:{:06x}:{}:{:016x}:{:08x}:{:x}\n",
            self.qpn, self.psn, gid, self.addr, self.rkey, self.n
        )
    }

    pub fn decode(line: &str) -> Res<PeerInfo> {
        let bad = || format!("malformed peer info {line:?}");
        let f: Vec<&str> = line.trim().split(':').collect();
        if f.len() != 6 || f[2].len() != 32 {
            return Err(bad());
        }
        let hex32 = |s: &str| u32::from_str_radix(s, 16).map_err(|_| bad());
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(&f[2][2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(PeerInfo {
            qpn: hex32(f[0])?,
            psn: hex32(f[1])?,
            gid,
            addr: u64::from_str_radix(f[3], 16).map_err(|_| bad())?,
            rkey: hex32(f[4])?,
            n: hex32(f[5])?,
        })
    }
}

/// The out-of-band TCP connection: line-oriented, with read timeouts.
pub struct Oob {
    pub r: BufReader<TcpStream>,
    pub w: TcpStream,
}

impl Oob {
    pub fn new(s: TcpStream, timeout: Duration) -> Res<Oob> {
        s.set_nonblocking(false).map_err(|e| format!("tcp: {e}"))?;
        s.set_read_timeout(Some(timeout))
            .map_err(|e| format!("tcp: {e}"))?;
        s.set_nodelay(true).ok();
        let w = s.try_clone().map_err(|e| format!("tcp: {e}"))?;
        Ok(Oob {
            r: BufReader::new(s),
            w,
        })
    }

    pub fn send(&mut self, line: &str) -> Res<()> {
        self.w
            .write_all(line.as_bytes())
            .map_err(|e| format!("tcp send: {e}"))
    }

    pub fn recv(&mut self) -> Res<String> {
        let mut l = String::new();
        match self.r.read_line(&mut l) {
            Ok(0) => Err("tcp: peer closed the connection".into()),
            Ok(_) => Ok(l),
            Err(e) => Err(format!("tcp receive: {e}")),
        }
    }
}

/// Accept one client within `timeout`.
pub fn accept(l: &TcpListener, timeout: Duration) -> Res<TcpStream> {
    l.set_nonblocking(true).map_err(|e| format!("tcp: {e}"))?;
    let deadline = Instant::now() + timeout;
    loop {
        match l.accept() {
            Ok((s, _)) => return Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(format!("no client connected within {timeout:?}"));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    }
}

pub fn connect_tcp(host: &str, port: u16, timeout: Duration) -> Res<TcpStream> {
    let addrs: Vec<_> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("resolve {host}: {e}"))?
        .collect();
    let mut last = format!("{host}:{port}: no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = format!("couldn't connect to {a}: {e}"),
        }
    }
    Err(last)
}

#[allow(dead_code)]
/// One RC endpoint: context, PD, CQ (with an optional completion channel), QP and MR.
pub struct Endpoint {
    pub name: &'static str,
    pub ctx: Context,
    pub _pd: ProtectionDomain,
    pub channel: Option<CompletionChannel>,
    pub cq: CompletionQueue,
    pub qp: QueuePair,
    pub mr: MemoryRegion,
    pub psn: u32,
    pub timeout: Duration,
}

#[allow(dead_code)]
impl Endpoint {
    pub fn new(
        name: &'static str,
        dev: Option<&str>,
        mr_len: usize,
        access: AccessFlags,
        with_channel: bool,
        timeout: Duration,
    ) -> Res<Endpoint> {
        let e = |what: &'static str| {
            move |err: softrdma::verbs::VerbsError| format!("{name}: {what}: {err}")
        };
        let devices = softrdma::devices().map_err(|e| format!("{name}: device list: {e}"))?;
        let dev = match dev {
            None => devices.into_iter().next().ok_or("no softrdma device")?,
            Some(d) => devices
                .into_iter()
                .find(|x| x.name() == d)
                .ok_or_else(|| format!("{name}: no device {d}"))?,
        };
        let ctx = dev.open().map_err(e("open device"))?;
        let channel = if with_channel {
            Some(
                ctx.create_comp_channel()
                    .map_err(e("create_comp_channel"))?,
            )
        } else {
            None
        };
        let pd = ctx.alloc_pd().map_err(e("alloc_pd"))?;
        let cq = ctx
            .create_cq(128, channel.as_ref())
            .map_err(e("create_cq"))?;
        let qp = pd
            .create_qp(&QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                cap: QpCaps {
                    max_send_wr: 32,
                    max_recv_wr: 32,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: QpType::Rc,
                sq_sig_all: true,
                srq: None,
            })
            .map_err(e("create_qp"))?;
        let mr = pd.alloc_mr(mr_len, access).map_err(e("alloc_mr"))?;
        qp.modify(&QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            qp_access_flags: Some(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ),
            ..Default::default()
        })
        .map_err(e("modify_qp to INIT"))?;
        let mut b = [0u8; 4];
        getrandom::getrandom(&mut b).map_err(|e| format!("getrandom: {e}"))?;
        Ok(Endpoint {
            name,
            ctx,
            _pd: pd,
            channel,
            cq,
            qp,
            mr,
            psn: u32::from_le_bytes(b) & 0xff_ffff,
            timeout,
        })
    }

    pub fn info(&self, n: u32) -> PeerInfo {
        PeerInfo {
            qpn: self.qp.qp_num(),
            psn: self.psn,
            gid: self.ctx.gid(),
            addr: self.mr.addr(),
            rkey: self.mr.rkey(),
            n,
        }
    }

    /// INIT→RTR→RTS towards `peer` (the QP went RESET→INIT in `new`, so receives could be
    /// posted before the exchange).
    pub fn connect(&self, peer: &PeerInfo) -> Res<()> {
        let name = self.name;
        let e = |what: &'static str| move |err| format!("{name}: modify_qp to {what}: {err}");
        self.qp
            .modify(&QpAttr {
                qp_state: Some(QpState::Rtr),
                path_mtu: Some(Mtu::Mtu1024),
                dest_qp_num: Some(peer.qpn),
                rq_psn: Some(peer.psn),
                max_dest_rd_atomic: Some(1),
                min_rnr_timer: Some(12),
                ah_attr: Some(AddressVector {
                    dgid: peer.gid,
                    sgid_index: 1,
                    hop_limit: 64,
                    port_num: 1,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .map_err(e("RTR"))?;
        self.qp
            .modify(&QpAttr {
                qp_state: Some(QpState::Rts),
                sq_psn: Some(self.psn),
                timeout: Some(14),
                retry_cnt: Some(7),
                rnr_retry: Some(7),
                max_rd_atomic: Some(1),
                ..Default::default()
            })
            .map_err(e("RTS"))?;
        Ok(())
    }

    pub fn sge(&self, off: usize, len: usize) -> Sge {
        Sge {
            addr: self.mr.addr() + off as u64,
            length: len as u32,
            lkey: self.mr.lkey(),
        }
    }

    pub fn post_recv(&self, wr_id: u64, off: usize, len: usize) -> Res<()> {
        self.qp
            .post_recv(&[RecvWr {
                wr_id,
                sg_list: &[self.sge(off, len)],
            }])
            .map_err(|e| format!("{}: post_recv: {e}", self.name))
    }

    pub fn post_send(&self, wr_id: u64, op: SendOp, off: usize, len: usize) -> Res<()> {
        self.qp
            .post_send(&[SendWr {
                wr_id,
                op,
                sg_list: &[self.sge(off, len)],
                flags: SendFlags::default(),
            }])
            .map_err(|e| format!("{}: post_send: {e}", self.name))
    }

    /// Busy-poll (bounded) for the next completion; fails unless it is successful.
    pub fn next_wc(&self) -> Res<WorkCompletion> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(wc) = self
                .cq
                .poll_one()
                .map_err(|e| format!("{}: poll_cq: {e}", self.name))?
            {
                return check(self.name, wc);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{}: no completion within {:?}",
                    self.name, self.timeout
                ));
            }
            std::thread::yield_now();
        }
    }

    pub fn read_str(&self, off: usize, len: usize) -> Res<String> {
        let mut b = vec![0u8; len];
        self.mr.read(off, &mut b).map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }
}

pub fn check(name: &str, wc: WorkCompletion) -> Res<WorkCompletion> {
    if wc.status != WcStatus::Success {
        return Err(format!(
            "{name}: completion for wr_id {} failed: {}",
            wc.wr_id,
            wc.status.as_str()
        ));
    }
    Ok(wc)
}

/// How an example was asked to run.
pub struct Roles<'a> {
    pub name: &'static str,
    pub host: Option<&'a str>,
    pub server: bool,
    pub port: u16,
    pub timeout: Duration,
}

/// Run the server role (`--server`), the client role (`<host>`), or with neither both roles in
/// one process over loopback: a server thread and the client, each with its own context.
pub fn run_roles<O: Clone + Send + 'static>(
    r: Roles<'_>,
    o: &O,
    server: fn(TcpListener, &O) -> Res<()>,
    client: fn(TcpStream, &O) -> Res<()>,
) -> Res<()> {
    match (r.host, r.server) {
        (Some(_), true) => Err("give either --server or a host, not both".into()),
        (None, true) => {
            let l = TcpListener::bind(("0.0.0.0", r.port))
                .map_err(|e| format!("couldn't listen on port {}: {e}", r.port))?;
            server(l, o)
        }
        (Some(h), false) => client(connect_tcp(h, r.port, r.timeout)?, o),
        (None, false) => {
            println!(
                "{}: loopback mode (server thread + client, two contexts)",
                r.name
            );
            let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("tcp bind: {e}"))?;
            let port = l.local_addr().map_err(|e| e.to_string())?.port();
            let so = o.clone();
            let srv = std::thread::spawn(move || server(l, &so));
            // A failed client returns at once (exiting the process ends the server thread).
            connect_tcp("127.0.0.1", port, r.timeout).and_then(|s| client(s, o))?;
            srv.join()
                .map_err(|_| "server thread panicked".to_string())?
        }
    }
}

/// Print the outcome as `NAME: OK` or `NAME: FAILED: why` and turn it into an exit code.
pub fn finish(name: &str, r: Res<()>) -> std::process::ExitCode {
    match r {
        Ok(()) => {
            println!("{name}: OK");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{name}: FAILED: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
