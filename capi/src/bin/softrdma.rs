//! `softrdma`: the devices softrdma offers, and any RDMA program run on softrdma's
//! `libibverbs.so.1` / `librdmacm.so.1`.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::{Parser, Subcommand};
use softrdma::verbs::{devices, Device};

#[derive(Parser)]
#[command(
    name = "softrdma",
    version,
    about = "RDMA over a user-space RoCEv2 transport: no NIC, no kernel module, no root"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// List the devices, as `ibv_devices` does.
    Devices,
    /// Show each device's attributes and port, as `ibv_devinfo` does.
    Devinfo {
        /// Only this device.
        #[arg(short = 'd', long = "ib-dev")]
        device: Option<String>,
    },
    /// Run a program on softrdma's libibverbs.so.1 and librdmacm.so.1, e.g.
    /// `softrdma run -- ib_write_bw` or `softrdma run -- rping -s`.
    Run {
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Print the directory that holds softrdma's libraries (for LD_LIBRARY_PATH).
    Libdir,
    /// Hand out sockets on UDP port 4791 to softrdma users (run as root, e.g. from systemd),
    /// where the administrator made the port privileged so that nobody else can take it:
    /// `sysctl net.ipv4.ip_unprivileged_port_start=4792` (docs/security.md).
    Holder {
        /// Serve only these users (names or uids; repeat the option). Default: every user.
        #[arg(long = "user")]
        users: Vec<String>,
        /// Where to listen.
        #[arg(long, default_value = softrdma::host::HOLDER_SOCKET)]
        socket: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Devices => list_devices(),
        Cmd::Devinfo { device } => devinfo(device.as_deref()),
        Cmd::Run { command } => run(&command),
        Cmd::Libdir => lib_dir().map(|d| println!("{}", d.display())),
        Cmd::Holder { users, socket } => holder(&users, &socket),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softrdma: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A user name or uid, as a uid.
fn uid_of(user: &str) -> Result<u32, String> {
    if let Ok(u) = user.parse() {
        return Ok(u);
    }
    let passwd = std::fs::read_to_string("/etc/passwd").map_err(|e| e.to_string())?;
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 2 && f[0] == user).then(|| f[2].parse().ok())?
        })
        .ok_or_else(|| format!("no user {user}"))
}

fn holder(users: &[String], socket: &Path) -> Result<(), String> {
    let users = users
        .iter()
        .map(|u| uid_of(u))
        .collect::<Result<Vec<u32>, String>>()?;
    eprintln!("softrdma holder: serving {}", socket.display());
    softrdma::host::serve_holder(socket, &softrdma::host::HolderPolicy { users })
        .map_err(|e| format!("{}: {e}", socket.display()))
}

fn list_devices() -> Result<(), String> {
    let devs = devices().map_err(|e| e.to_string())?;
    println!("    {:<16}\t    {:<16}", "device", "node GUID");
    println!("    {:<16}\t{:<16}", "------", "----------------");
    for d in devs {
        println!("    {:<16}\t{:016x}", d.name(), d.guid());
    }
    Ok(())
}

fn guid_str(g: u64) -> String {
    let b = g.to_be_bytes();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

fn devinfo(only: Option<&str>) -> Result<(), String> {
    let devs: Vec<Device> = devices()
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|d| only.is_none_or(|n| d.name() == n))
        .collect();
    if devs.is_empty() {
        return Err(match only {
            Some(n) => format!("no device named {n}"),
            None => "no devices".into(),
        });
    }
    for d in devs {
        let ctx = d.open().map_err(|e| format!("{}: {e}", d.name()))?;
        let a = ctx.query_device();
        let p = ctx.query_port(1).map_err(|e| e.to_string())?;
        println!("hca_id:\t{}", d.name());
        println!("\ttransport:\t\t\tInfiniBand (0)");
        println!("\tfw_ver:\t\t\t\t{}", a.fw_ver);
        println!("\tnode_guid:\t\t\t{}", guid_str(a.node_guid));
        println!("\tsys_image_guid:\t\t\t{}", guid_str(a.sys_image_guid));
        println!("\tvendor_id:\t\t\t0x{:04x}", a.vendor_id);
        println!("\tvendor_part_id:\t\t\t{}", a.vendor_part_id);
        println!("\thw_ver:\t\t\t\t0x{:x}", a.hw_ver);
        println!("\tphys_port_cnt:\t\t\t{}", a.phys_port_cnt);
        let addrs: Vec<String> = ctx.ip_addrs().iter().map(|a| a.to_string()).collect();
        println!("\tnetdev:\t\t\t\t{} ({})", d.ifname(), addrs.join(", "));
        println!("\t\tport:\t1");
        println!("\t\t\tstate:\t\t\tPORT_ACTIVE (4)");
        println!(
            "\t\t\tmax_mtu:\t\t{} ({})",
            p.max_mtu.bytes(),
            p.max_mtu as u32
        );
        println!(
            "\t\t\tactive_mtu:\t\t{} ({})",
            p.active_mtu.bytes(),
            p.active_mtu as u32
        );
        println!("\t\t\tsm_lid:\t\t\t0");
        println!("\t\t\tport_lid:\t\t{}", p.lid);
        println!("\t\t\tport_lmc:\t\t0x00");
        println!("\t\t\tlink_layer:\t\tEthernet");
        for i in 0..p.gid_tbl_len.min(256) as u16 {
            if let Ok(g) = ctx.query_gid(1, i as u8) {
                let s: Vec<String> = g
                    .chunks(2)
                    .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
                    .collect();
                println!("\t\t\tGID[{i:3}]:\t\t{}, RoCE v2", s.join(":"));
            }
        }
        println!();
    }
    Ok(())
}

/// The names programs load, all served by softrdma's one shared object.
const LIB_NAMES: [&str; 6] = [
    "libibverbs.so.1",
    "libibverbs.so",
    "librdmacm.so.1",
    "librdmacm.so",
    "libmlx5.so.1",
    "libefa.so.1",
];

/// The shared object built beside this executable: the newest of `libsoftrdma_capi.so` here,
/// in `deps/` (where `cargo test` leaves it, since it builds the library only as a dependency)
/// and in `../lib` (an installed layout).
fn shared_object() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = exe.parent().ok_or("no directory for the executable")?;
    let name = "libsoftrdma_capi.so";
    [
        dir.join(name),
        dir.join("deps").join(name),
        dir.join("../lib").join(name),
    ]
    .into_iter()
    .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
    .max_by_key(|(modified, _)| *modified)
    .map(|(_, p)| p)
    .ok_or_else(|| {
        format!(
            "{name} is not in {}: build it with `cargo build --release -p softrdma-capi`",
            dir.display()
        )
    })
}

/// A directory of the library names, each a symbolic link to the shared object: beside the
/// executable if that is writable, else in the user's private softrdma state directory (never
/// a shared temporary directory, where another user could plant the libraries a program --
/// root's too -- would load).
fn lib_dir() -> Result<PathBuf, String> {
    let so = shared_object()?;
    let so = so.canonicalize().map_err(|e| e.to_string())?;
    let beside = so.parent().map(|p| p.join("softrdma-lib"));
    let mut last = String::new();
    if let Some(dir) = beside {
        match populate(&dir, &so) {
            Ok(()) => return Ok(dir),
            Err(e) => last = format!("{}: {e}", dir.display()),
        }
    }
    let private = softrdma::host::private_dir("lib").map_err(|e| format!("{last}; {e}"))?;
    populate(&private, &so).map_err(|e| format!("{last}; {}: {e}", private.display()))?;
    Ok(private)
}

fn populate(dir: &Path, so: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for name in LIB_NAMES {
        let link = dir.join(name);
        if std::fs::read_link(&link).ok().as_deref() == Some(so) {
            continue;
        }
        // Replace atomically: a link made aside, then renamed over the name.
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(so, &tmp)?;
        std::fs::rename(&tmp, &link)?;
    }
    Ok(())
}

fn run(command: &[String]) -> Result<(), String> {
    let dir = lib_dir()?;
    let path = match std::env::var_os("LD_LIBRARY_PATH") {
        Some(old) if !old.is_empty() => {
            let mut p = dir.clone().into_os_string();
            p.push(":");
            p.push(old);
            p
        }
        _ => dir.into_os_string(),
    };
    // Replace this process, so the program gets our pid, signals and exit status directly.
    let err = Command::new(&command[0])
        .args(&command[1..])
        .env("LD_LIBRARY_PATH", path)
        .exec();
    Err(format!("{}: {err}", command[0]))
}
