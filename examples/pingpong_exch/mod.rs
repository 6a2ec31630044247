//! rdma-core's pingpong exchange (`ibv_rc_pingpong`, `ibv_ud_pingpong`): over TCP the client
//! sends `"%04x:%06x:%06x:%s"` (LID, QPN, PSN, GID as 32 hex digits in wire byte order) plus a
//! NUL, 52 bytes; the server answers in kind; the client ends with `"done\0"`.

use std::io::{Read, Write};
use std::net::{Ipv6Addr, TcpStream};

/// `sizeof "0000:000000:000000:00000000000000000000000000000000"`, NUL included.
pub const MSG_LEN: usize = 52;

#[derive(Clone, Copy, Debug)]
pub struct Dest {
    pub lid: u16,
    pub qpn: u32,
    pub psn: u32,
    pub gid: [u8; 16],
}

pub fn dest_to_msg(d: &Dest) -> [u8; MSG_LEN] {
    let mut gid = String::new();
    for b in d.gid {
        gid.push_str(&format!("{b:02x}"));
    }
    let s = format!("{:04x}:{:06x}:{:06x}:{}", d.lid, d.qpn, d.psn, gid);
    let mut m = [0u8; MSG_LEN];
    m[..s.len()].copy_from_slice(s.as_bytes());
    m
}

pub fn msg_to_dest(m: &[u8]) -> Option<Dest> {
    let end = m.iter().position(|&b| b == 0).unwrap_or(m.len());
    let s = std::str::from_utf8(&m[..end]).ok()?;
    let mut it = s.splitn(4, ':');
    let lid = u16::from_str_radix(it.next()?, 16).ok()?;
    let qpn = u32::from_str_radix(it.next()?, 16).ok()?;
    let psn = u32::from_str_radix(it.next()?, 16).ok()?;
    let g = it.next()?;
    if g.len() < 32 {
        return None;
    }
    let mut gid = [0u8; 16];
    for (i, b) in gid.iter_mut().enumerate() {
        *b = u8::from_str_radix(&g[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(Dest { lid, qpn, psn, gid })
}

pub fn gid_str(gid: &[u8; 16]) -> String {
    Ipv6Addr::from(*gid).to_string()
}

/// Read one message; tolerates a peer that sends fewer bytes (e.g. the 5-byte "done").
pub fn read_msg(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut buf = [0u8; MSG_LEN];
    let mut got = 0;
    while got < MSG_LEN {
        let n = s.read(&mut buf[got..])?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(buf[..got].to_vec())
}

pub fn client_exch_dest(server: &str, port: u16, my: &Dest) -> Result<Dest, String> {
    let mut s = TcpStream::connect((server, port))
        .map_err(|_| format!("Couldn't connect to {server}:{port}"))?;
    s.write_all(&dest_to_msg(my))
        .map_err(|_| "Couldn't send local address".to_string())?;
    let m = read_msg(&mut s).map_err(|_| "Couldn't read/write remote address".to_string())?;
    if m.len() != MSG_LEN {
        return Err("Couldn't read/write remote address".to_string());
    }
    s.write_all(b"done\0")
        .map_err(|_| "Couldn't read/write remote address".to_string())?;
    msg_to_dest(&m).ok_or_else(|| "Couldn't read/write remote address".to_string())
}
