//! `ibv_ud_pingpong` for softrdma: same flags, same TCP exchange of LID:QPN:PSN:GID, same output,
//! so it interoperates with rdma-core's `ibv_ud_pingpong` (on kernel rdma_rxe) in either role.
//! Every message is one UD SEND to the peer's QPN with Q_Key 0x11111111, addressed by an AH
//! built from the peer's GID; receive buffers hold the 40-byte GRH area before the payload.
//!
//! ```text
//! cargo run --release --example ud_pingpong -- -g 1              # server
//! cargo run --release --example ud_pingpong -- -g 1 127.0.0.1    # client
//! ```

use std::io::Write;
use std::net::TcpListener;
use std::process::ExitCode;
use std::time::Instant;

use softrdma::verbs::{AccessFlags, QpAttr, QpCaps, QpState, SendFlags, SendOp, Sge, WcStatus};
use softrdma::verbs::{
    AddressHandle, AhAttr, CompletionChannel, Context, QpInitAttr, QpType, RecvWr, UdSendWr,
    WorkCompletion, GRH_LEN,
};

mod getopt;
#[path = "pingpong_exch/mod.rs"]
mod pingpong_exch;
use pingpong_exch::*;

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// The Q_Key both sides use.
const QKEY: u32 = 0x1111_1111;
/// `sysconf(_SC_PAGESIZE)`, for `-c`.
const PAGE_SIZE: usize = 4096;

struct Opts {
    port: u16,
    ib_dev: Option<String>,
    ib_port: u8,
    size: usize,
    rx_depth: usize,
    iters: usize,
    sl: u8,
    events: bool,
    gidx: i32,
    validate: bool,
    server: Option<String>,
}

fn usage(argv0: &str) {
    println!("Usage:");
    println!("  {argv0}            start a server and wait for connection");
    println!("  {argv0} <host>     connect to server at <host>");
    println!();
    println!("Options:");
    println!("  -p, --port=<port>      listen on/connect to port <port> (default 18515)");
    println!("  -d, --ib-dev=<dev>     use IB device <dev> (default first device found)");
    println!("  -i, --ib-port=<port>   use port <port> of IB device (default 1)");
    println!("  -s, --size=<size>      size of message to exchange (default 2048)");
    println!("  -r, --rx-depth=<dep>   number of receives to post at a time (default 500)");
    println!("  -n, --iters=<iters>    number of exchanges (default 1000)");
    println!("  -l, --sl=<SL>          send messages with service level <SL> (default 0)");
    println!("  -e, --events           sleep on CQ events (default poll)");
    println!("  -g, --gid-idx=<gid index> local port gid index");
    println!("  -c, --chk              validate received buffer");
}

/// `getopt_long(argc, argv, "p:d:i:s:r:n:l:eg:c", ...)` as `ibv_ud_pingpong` parses it.
fn parse_args() -> Result<Opts, ()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let spec = getopt::Spec {
        with_value: "pdisrnlg",
        flags: "ec",
        long: &[
            ("port", 'p'),
            ("ib-dev", 'd'),
            ("ib-port", 'i'),
            ("size", 's'),
            ("rx-depth", 'r'),
            ("iters", 'n'),
            ("sl", 'l'),
            ("events", 'e'),
            ("gid-idx", 'g'),
            ("chk", 'c'),
        ],
    };
    let mut o = Opts {
        port: 18515,
        ib_dev: None,
        ib_port: 1,
        size: 2048,
        rx_depth: 500,
        iters: 1000,
        sl: 0,
        events: false,
        gidx: -1,
        validate: false,
        server: None,
    };
    for arg in getopt::parse(&args, &spec).map_err(|_| ())? {
        let (opt, val) = match arg {
            getopt::Arg::Positional(host) if o.server.is_none() => {
                o.server = Some(host);
                continue;
            }
            getopt::Arg::Positional(_) => return Err(()),
            getopt::Arg::Opt(opt, val) => (opt, val.unwrap_or_default()),
        };
        let num = || getopt::c_num(&val).ok_or(());
        match opt {
            'e' => o.events = true,
            'c' => o.validate = true,
            'p' => o.port = u16::try_from(num()?).map_err(|_| ())?,
            'd' => o.ib_dev = Some(val.clone()),
            'i' => o.ib_port = u8::try_from(num()?).map_err(|_| ())?.max(1),
            's' => o.size = num()? as usize,
            'r' => o.rx_depth = num()? as usize,
            'n' => o.iters = num()? as usize,
            'l' => o.sl = num()? as u8,
            'g' => o.gidx = num()? as i32,
            _ => return Err(()),
        }
    }
    Ok(o)
}

struct Pingpong {
    ctx: Context,
    pd: softrdma::verbs::ProtectionDomain,
    cq: softrdma::verbs::CompletionQueue,
    channel: Option<CompletionChannel>,
    qp: softrdma::verbs::QueuePair,
    mr: softrdma::verbs::MemoryRegion,
    ah: Option<AddressHandle>,
    size: usize,
    send_flags: SendFlags,
    rx_depth: usize,
}

impl Pingpong {
    /// Receives of `size + 40` bytes at the start of the buffer: GRH area, then payload.
    fn post_recv(&self, n: usize) -> usize {
        let sge = [Sge {
            addr: self.mr.addr(),
            length: (self.size + GRH_LEN) as u32,
            lkey: self.mr.lkey(),
        }];
        let wr = RecvWr {
            wr_id: RECV_WRID,
            sg_list: &sge,
        };
        for i in 0..n {
            if self.qp.post_recv(std::slice::from_ref(&wr)).is_err() {
                return i;
            }
        }
        n
    }

    /// One SEND of `size` bytes from just after the GRH area.
    fn post_send(&self, qpn: u32) -> bool {
        let Some(ah) = &self.ah else {
            return false;
        };
        let sge = [Sge {
            addr: self.mr.addr() + GRH_LEN as u64,
            length: self.size as u32,
            lkey: self.mr.lkey(),
        }];
        let wr = UdSendWr {
            wr_id: SEND_WRID,
            op: SendOp::Send,
            sg_list: &sge,
            flags: self.send_flags,
            ah,
            remote_qpn: qpn,
            remote_qkey: QKEY,
        };
        self.qp.post_send_ud(&[wr]).is_ok()
    }

    /// RTR, RTS with our PSN, and the AH for the peer (global when its GID has an interface ID).
    fn connect(&mut self, o: &Opts, my_psn: u32, dest: &Dest) -> Result<(), String> {
        self.qp
            .modify(&QpAttr {
                qp_state: Some(QpState::Rtr),
                ..Default::default()
            })
            .map_err(|_| "Failed to modify QP to RTR".to_string())?;
        self.qp
            .modify(&QpAttr {
                qp_state: Some(QpState::Rts),
                sq_psn: Some(my_psn),
                ..Default::default()
            })
            .map_err(|_| "Failed to modify QP to RTS".to_string())?;
        let mut attr = AhAttr {
            dlid: dest.lid,
            sl: o.sl,
            port_num: o.ib_port,
            ..Default::default()
        };
        if dest.gid[8..].iter().any(|&b| b != 0) {
            attr.hop_limit = 1;
            attr.dgid = dest.gid;
            attr.sgid_index = o.gidx.max(0) as u8;
        }
        let ah = self
            .pd
            .create_ah(&attr)
            .map_err(|e| format!("Failed to create AH: {e}"))?;
        self.ah = Some(ah);
        Ok(())
    }

    /// `-c`: what `ibv_ud_pingpong` writes before a send and checks after a receive, one byte
    /// per page of the payload: `i / page_size % sizeof(char)`, which is always 0.
    fn fill_pattern(&self) {
        let mut g = self.mr.lock().expect("an owned region");
        for i in (0..self.size).step_by(PAGE_SIZE) {
            g[GRH_LEN + i] = 0;
        }
    }

    fn check_pattern(&self) -> bool {
        let g = self.mr.lock().expect("an owned region");
        (0..self.size)
            .step_by(PAGE_SIZE)
            .all(|i| g[GRH_LEN + i] == 0)
    }
}

fn init_ctx(o: &Opts) -> Result<Pingpong, String> {
    let devices = softrdma::devices().map_err(|e| format!("Failed to get IB devices list: {e}"))?;
    let dev = match &o.ib_dev {
        None => devices.into_iter().next().ok_or("No IB devices found")?,
        Some(name) => devices
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| format!("IB device {name} not found"))?,
    };
    let ctx = dev
        .open()
        .map_err(|e| format!("Couldn't get context for {}: {e}", dev.name()))?;
    let port = ctx
        .query_port(o.ib_port)
        .map_err(|_| format!("Unable to query port info for port {}", o.ib_port))?;
    let mtu = port.active_mtu.bytes();
    if o.size > mtu {
        return Err(format!("Requested size larger than port MTU ({mtu})"));
    }
    let channel = if o.events {
        Some(
            ctx.create_comp_channel()
                .map_err(|e| format!("Couldn't create completion channel: {e}"))?,
        )
    } else {
        None
    };
    let pd = ctx
        .alloc_pd()
        .map_err(|e| format!("Couldn't allocate PD: {e}"))?;
    let mr = pd
        .alloc_mr(o.size + GRH_LEN, AccessFlags::LOCAL_WRITE)
        .map_err(|e| format!("Couldn't register MR: {e}"))?;
    mr.lock().expect("an owned region").fill(0x7b);
    let cq = ctx
        .create_cq(o.rx_depth as u32 + 1, channel.as_ref())
        .map_err(|e| format!("Couldn't create CQ: {e}"))?;
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCaps {
                max_send_wr: 1,
                max_recv_wr: o.rx_depth as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: QpType::Ud,
            sq_sig_all: false,
            srq: None,
        })
        .map_err(|e| format!("Couldn't create QP: {e}"))?;
    let mut send_flags = SendFlags::SIGNALED;
    if qp.caps().max_inline_data as usize >= o.size {
        send_flags.insert(SendFlags::INLINE);
    }
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(o.ib_port),
        qkey: Some(QKEY),
        ..Default::default()
    })
    .map_err(|e| format!("Failed to modify QP to INIT: {e}"))?;
    Ok(Pingpong {
        ctx,
        pd,
        cq,
        channel,
        qp,
        mr,
        ah: None,
        size: o.size,
        send_flags,
        rx_depth: o.rx_depth,
    })
}

fn server_exch_dest(pp: &mut Pingpong, o: &Opts, my: &Dest) -> Result<Dest, String> {
    let l = TcpListener::bind(("0.0.0.0", o.port))
        .map_err(|_| format!("Couldn't listen to port {}", o.port))?;
    let (mut s, _) = l.accept().map_err(|_| "accept() failed".to_string())?;
    drop(l);
    let m = read_msg(&mut s).map_err(|_| "Couldn't read remote address".to_string())?;
    let rem = match msg_to_dest(&m) {
        Some(d) if m.len() == MSG_LEN => d,
        _ => {
            return Err(format!(
                "{}/{MSG_LEN}: Couldn't read remote address",
                m.len()
            ))
        }
    };
    pp.connect(o, my.psn, &rem)
        .map_err(|e| format!("{e}\nCouldn't connect to remote QP"))?;
    s.write_all(&dest_to_msg(my))
        .map_err(|_| "Couldn't send/recv local address".to_string())?;
    let _ = read_msg(&mut s);
    Ok(rem)
}

fn run(o: Opts) -> Result<(), String> {
    let mut pp = init_ctx(&o)?;
    let mut routs = pp.post_recv(pp.rx_depth);
    if routs < pp.rx_depth {
        return Err(format!("Couldn't post receive ({routs})"));
    }
    if o.events {
        pp.cq
            .req_notify(false)
            .map_err(|_| "Couldn't request CQ notification".to_string())?;
    }
    let port = pp
        .ctx
        .query_port(o.ib_port)
        .map_err(|_| "Couldn't get port info".to_string())?;
    let gid = if o.gidx >= 0 {
        pp.ctx
            .query_gid(o.ib_port, o.gidx as u8)
            .map_err(|_| format!("Could not get local gid for gid index {}", o.gidx))?
    } else {
        [0u8; 16]
    };
    let my = Dest {
        lid: port.lid,
        qpn: pp.qp.qp_num(),
        psn: getopt::random_psn(),
        gid,
    };
    // As ibv_ud_pingpong prints it (a colon before GID).
    println!(
        "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}: GID {}",
        my.lid,
        my.qpn,
        my.psn,
        gid_str(&my.gid)
    );
    let rem = match &o.server {
        Some(server) => client_exch_dest(server, o.port, &my)?,
        None => server_exch_dest(&mut pp, &o, &my)?,
    };
    println!(
        "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        rem.lid,
        rem.qpn,
        rem.psn,
        gid_str(&rem.gid)
    );
    if o.server.is_some() {
        pp.connect(&o, my.psn, &rem)?;
    }

    let mut pending = RECV_WRID;
    if o.server.is_some() {
        if o.validate {
            pp.fill_pattern();
        }
        if !pp.post_send(rem.qpn) {
            return Err("Couldn't post send".into());
        }
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    let (mut rcnt, mut scnt, mut num_cq_events) = (0usize, 0usize, 0u32);
    let mut wc = [WorkCompletion::default(); 2];
    while rcnt < o.iters || scnt < o.iters {
        if let Some(ch) = &pp.channel {
            let _ev_cq = ch
                .get_cq_event()
                .map_err(|_| "Failed to get cq_event".to_string())?;
            num_cq_events += 1;
            pp.cq
                .req_notify(false)
                .map_err(|_| "Couldn't request CQ notification".to_string())?;
        }
        let ne = loop {
            let ne = pp
                .cq
                .poll(&mut wc)
                .map_err(|e| format!("poll CQ failed {e}"))?;
            if o.events || ne >= 1 {
                break ne;
            }
        };
        for w in &wc[..ne] {
            if w.status != WcStatus::Success {
                return Err(format!(
                    "Failed status {} ({}) for wr_id {}",
                    w.status.as_str(),
                    w.status as u32,
                    w.wr_id as i32
                ));
            }
            match w.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= 1 {
                        routs += pp.post_recv(pp.rx_depth - routs);
                        if routs < pp.rx_depth {
                            return Err(format!("Couldn't post receive ({routs})"));
                        }
                    }
                    rcnt += 1;
                    if o.validate && !pp.check_pattern() {
                        return Err(
                            "Check failed: received buffer does not hold the pattern".into()
                        );
                    }
                }
                other => return Err(format!("Completion for unknown wr_id {}", other as i32)),
            }
            pending &= !w.wr_id;
            if scnt < o.iters && pending == 0 {
                if o.validate {
                    pp.fill_pattern();
                }
                if !pp.post_send(rem.qpn) {
                    return Err("Couldn't post send".into());
                }
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let usec = start.elapsed().as_secs_f64() * 1e6;
    let bytes = (o.size * o.iters * 2) as u64;
    println!(
        "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
        bytes,
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        o.iters,
        usec / 1e6,
        usec / o.iters as f64
    );
    pp.cq.ack_events(num_cq_events);
    Ok(())
}

fn main() -> ExitCode {
    let argv0 = std::env::args()
        .next()
        .unwrap_or_else(|| "ud_pingpong".into());
    let o = match parse_args() {
        Ok(o) => o,
        Err(()) => {
            usage(&argv0);
            return ExitCode::from(1);
        }
    };
    match run(o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(1)
        }
    }
}
