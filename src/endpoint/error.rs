//! Errors of the device (its objects and runtime) under the Verbs API (which maps each to its own
//! error, with the errno libibverbs would give).

/// Why the device runtime refused something.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("out of resources: {0}")]
    NoResources(&'static str),
    #[error("resource busy: {0}")]
    Busy(&'static str),
    #[error("completion queue overrun: more completions than its capacity")]
    CqOverrun,
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}
