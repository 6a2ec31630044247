//! An echo server and client over rdma_cm on the loopback device, on tokio: every wait (a
//! connection step, a completion) is an `.await`, with no thread of softrdma's own in the way.
//!
//! ```text
//! cargo run --example async_echo --features tokio
//! ```
use softrdma::rdma_cm::ConnectionOptions;
use softrdma::tokio::{connect, AsyncConnection, AsyncListener};
use softrdma::verbs::{AccessFlags, WcOpcode};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;
const MSG: usize = 64;

/// Receive messages and send each back, until "bye".
async fn serve(conn: AsyncConnection) -> Res<usize> {
    let mr = conn.pd().alloc_mr(2 * MSG, AccessFlags::LOCAL_WRITE)?;
    let mut echoed = 0;
    loop {
        conn.qp().recv(mr.slice(..MSG)?).post()?;
        let wc = conn.cq().next().await?.ok()?;
        assert_eq!(wc.opcode, WcOpcode::Recv);
        let mut msg = vec![0u8; wc.byte_len as usize];
        mr.read(0, &mut msg)?;
        mr.write(MSG, &msg)?;
        conn.qp().send(mr.slice(MSG..MSG + msg.len())?).post()?;
        conn.cq().next().await?.ok()?;
        if msg == b"bye" {
            return Ok(echoed);
        }
        echoed += 1;
    }
}

async fn client(conn: AsyncConnection, n: usize) -> Res<()> {
    let mr = conn.pd().alloc_mr(2 * MSG, AccessFlags::LOCAL_WRITE)?;
    for i in 0..=n {
        let msg = if i == n {
            "bye".to_string()
        } else {
            format!("hello {i}")
        };
        mr.write(0, msg.as_bytes())?;
        conn.qp().recv(mr.slice(MSG..)?).post()?;
        conn.qp().send(mr.slice(..msg.len())?).post()?;
        // The send's and the echo's completions, in either order.
        let (mut sent, mut back) = (false, None);
        while !sent || back.is_none() {
            let wc = conn.cq().next().await?.ok()?;
            match wc.opcode {
                WcOpcode::Send => sent = true,
                _ => back = Some(wc.byte_len as usize),
            }
        }
        let mut echo = vec![0u8; back.unwrap_or(0)];
        mr.read(MSG, &mut echo)?;
        assert_eq!(echo, msg.as_bytes(), "echo of message {i}");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Res<()> {
    let listener = AsyncListener::bind("127.0.0.1:0".parse()?)?;
    let to = listener.local_addr().ok_or("no address")?;
    let server = tokio::spawn(async move {
        let conn = listener.accept(&ConnectionOptions::default()).await?;
        serve(conn).await
    });
    let conn = connect(to, &ConnectionOptions::default()).await?;
    client(conn, 100).await?;
    let echoed = server.await??;
    println!("async_echo: {echoed} messages echoed over RDMA");
    Ok(())
}
