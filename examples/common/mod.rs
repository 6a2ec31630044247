//! Code shared by the seed ports (`send_recv`, `rdma_rw`, `epoll_loop`): the out-of-band TCP
//! exchange of QPN/PSN/GID (and buffer address and rkey), endpoint setup, QP connection and
//! bounded completion polling. Not every example uses every piece.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use softrdma::verbs::{
    AccessFlags, CompletionChannel, CompletionQueue, ConnectOptions, Context, MemoryRegion, Mtu,
    ProtectionDomain, Qp, QpCaps, QpEndpoint, QpInitAttr, QpType, Rc, SendFlags, SendOp, SendWr,
    WorkCompletion,
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

/// One RC endpoint: context, PD, CQ (with an optional completion channel), QP and MR.
pub struct Endpoint {
    pub name: &'static str,
    pub ctx: Context,
    pub channel: Option<CompletionChannel>,
    // Field order is drop order: the QP before its CQ and PD.
    pub qp: Qp<Rc>,
    pub cq: CompletionQueue,
    pub mr: MemoryRegion,
    pub pd: ProtectionDomain,
    pub timeout: Duration,
}

/// What the seeds' QPs use: path MTU 1024, one READ or atomic in flight each way.
fn options() -> ConnectOptions {
    let mut o = ConnectOptions::default();
    o.mtu = Some(Mtu::Mtu1024);
    o.max_rd_atomic = 1;
    o.access = Some(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ);
    o
}

impl Endpoint {
    /// Open the device, make the PD, CQ, QP (RESET→INIT, so receives can be posted before the
    /// exchange) and MR.
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
        let channel = match with_channel {
            true => Some(
                ctx.create_comp_channel()
                    .map_err(e("create_comp_channel"))?,
            ),
            false => None,
        };
        let pd = ctx.alloc_pd().map_err(e("alloc_pd"))?;
        let cq = ctx
            .create_cq(128, channel.as_ref())
            .map_err(e("create_cq"))?;
        let cap = QpCaps {
            max_send_wr: 32,
            max_recv_wr: 32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let attr = QpInitAttr {
            cap,
            sq_sig_all: true,
            ..QpInitAttr::new(QpType::Rc, &cq)
        };
        let qp = pd.create_typed_qp::<Rc>(&attr).map_err(e("create_qp"))?;
        let mr = pd.alloc_mr(mr_len, access).map_err(e("alloc_mr"))?;
        qp.init(&options()).map_err(e("modify_qp to INIT"))?;
        Ok(Endpoint {
            name,
            ctx,
            channel,
            qp,
            cq,
            mr,
            pd,
            timeout,
        })
    }

    pub fn info(&self, n: u32) -> PeerInfo {
        let me = self.qp.endpoint();
        PeerInfo {
            qpn: me.qpn,
            psn: me.psn,
            gid: me.gid,
            addr: self.mr.addr(),
            rkey: self.mr.rkey(),
            n,
        }
    }

    /// INIT→RTR→RTS towards `peer`.
    pub fn connect(&self, peer: &PeerInfo) -> Res<()> {
        let to = QpEndpoint {
            qpn: peer.qpn,
            psn: peer.psn,
            gid: peer.gid,
            mtu: 1024,
        };
        self.qp
            .connect(&to, &options())
            .map_err(|e| format!("{}: connect: {e}", self.name))
    }

    pub fn post_recv(&self, wr_id: u64, off: usize, len: usize) -> Res<()> {
        let buf = self.mr.slice(off..off + len).map_err(|e| e.to_string())?;
        (self.qp.recv(buf).id(wr_id).post()).map_err(|e| format!("{}: post_recv: {e}", self.name))
    }

    pub fn post_send(&self, wr_id: u64, op: SendOp, off: usize, len: usize) -> Res<()> {
        let sge = self
            .mr
            .slice(off..off + len)
            .map_err(|e| e.to_string())?
            .sge();
        let wr = SendWr {
            wr_id,
            op,
            sg_list: &[sge],
            flags: SendFlags::empty(),
        };
        (self.qp.post_send(&[wr])).map_err(|e| format!("{}: post_send: {e}", self.name))
    }

    /// The next completion (bounded wait); fails unless it is successful.
    pub fn next_wc(&self) -> Res<WorkCompletion> {
        let wc = self.cq.wait(self.timeout);
        let wc = wc.map_err(|e| format!("{}: {e}", self.name))?;
        wc.ok().map_err(|e| format!("{}: {e}", self.name))
    }

    pub fn read_str(&self, off: usize, len: usize) -> Res<String> {
        let mut b = vec![0u8; len];
        self.mr.read(off, &mut b).map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }
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
