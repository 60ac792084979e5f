//! The fixed newstyle handshake as a sans-IO state machine: bytes in, bytes out, no sockets
//! (NBD `doc/proto.md`, "Fixed newstyle negotiation", "Option types", "Option reply types",
//! and "Block size constraints").
//!
//! The driver sends [`Handshake::greeting`], then repeatedly reads exactly
//! [`Handshake::wants`] bytes, hands them to [`Handshake::feed`], and writes whatever `feed`
//! appended to `out`, until `feed` says [`Step::Transmission`] or [`Step::Close`]:
//!
//! ```text
//!  ClientFlags(4) ──► OptionHeader(16) ──► OptionData(len) ──┬─► OptionHeader(16) ...
//!                                                            ├─► Transmission (GO, EXPORT_NAME)
//!                                                            ├─► StartTls (TLS handshake on
//!                                                            │   the socket, then options again)
//!                                                            └─► Close (ABORT, bad input)
//! ```
//!
//! TLS ("TLS support" in the spec) follows [`TlsMode`]: `Off` is the spec's NOTLS mode,
//! `Require` its FORCEDTLS mode, and `On` offers `NBD_OPT_STARTTLS` without insisting (as
//! nbdkit's `--tls=on`).

use crate::proto::*;
use crate::ProtocolViolation;

/// Option data longer than this is a denial-of-service attempt: every option we support
/// fits in a few KiB (strings are at most 4096 bytes by the spec), and reading a client's
/// 4 GiB "option" into memory is what a bounded server must not do.
pub const MAX_OPTION_BYTES: u32 = 64 * 1024;

/// Options per connection before we treat the client as a denial of service ("if a server
/// believes a client's behaviour constitutes a denial of service, it MAY initiate a hard
/// disconnect").
pub const MAX_OPTIONS: u32 = 1024;

/// What is exported, as the handshake announces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// Export name ("" is the default export; both it and this name are accepted).
    pub name: String,
    /// Human-readable description (`NBD_INFO_DESCRIPTION`, `NBD_REP_SERVER` details).
    pub description: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Transmission flags, without `NBD_FLAG_SEND_DF` (added only once structured replies
    /// are negotiated, as the spec requires).
    pub flags: u16,
    /// Minimum block size (`NBD_INFO_BLOCK_SIZE`): the backend's logical block, or what
    /// `ServeOptions::min_block` lowers it to (512 for a `Volume`).
    pub min_block: u32,
    /// Preferred block size.
    pub preferred_block: u32,
    /// Maximum block size: the largest READ/WRITE payload the server accepts.
    pub max_block: u32,
}

/// What the client and server agreed on, for the transmission phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// Structured replies were negotiated (`NBD_OPT_STRUCTURED_REPLY`).
    pub structured_replies: bool,
    /// The transmission flags the client was given.
    pub flags: u16,
    /// The client entered transmission with `NBD_OPT_GO` having asked for
    /// `NBD_INFO_BLOCK_SIZE` (it promised to honour the constraints).
    pub block_size_agreed: bool,
    /// The client selected `base:allocation` with `NBD_OPT_SET_META_CONTEXT`
    /// (id [`BASE_ALLOCATION_ID`]): `NBD_CMD_BLOCK_STATUS` is answered.
    pub base_allocation: bool,
}

/// Whether the handshake offers or insists on TLS (nbdkit's `--tls=off|on|require`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMode {
    /// No TLS (the spec's NOTLS mode): `NBD_OPT_STARTTLS` gets `NBD_REP_ERR_UNSUP`.
    #[default]
    Off,
    /// TLS offered: a client may upgrade with `NBD_OPT_STARTTLS`, or stay in plaintext.
    On,
    /// TLS required (the spec's FORCEDTLS mode): before the upgrade every option but
    /// `NBD_OPT_STARTTLS` and `NBD_OPT_ABORT` gets `NBD_REP_ERR_TLS_REQD`.
    Require,
}

/// What the driver does after [`Handshake::feed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Send `out`, read [`Handshake::wants`] more bytes.
    Continue,
    /// Send `out`, then enter the transmission phase.
    Transmission(Negotiated),
    /// Send `out` (the `NBD_REP_ACK` to `NBD_OPT_STARTTLS`), run the TLS handshake on the
    /// same socket, call [`Handshake::tls_started`], and continue reading options, now over
    /// TLS ("all further data MUST be sent and received over TLS").
    StartTls,
    /// Send `out` (if anything), then close the connection.
    Close,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    ClientFlags,
    OptionHeader,
    OptionData { option: u32, len: u32 },
    Done,
}

/// The server side of a fixed newstyle handshake for one export.
#[derive(Debug)]
pub struct Handshake {
    export: ExportInfo,
    state: State,
    no_zeroes: bool,
    structured: bool,
    shutting_down: bool,
    options_seen: u32,
    tls: TlsMode,
    /// TLS has been initiated on this connection.
    tls_active: bool,
    /// `base:allocation` selected by the last `NBD_OPT_SET_META_CONTEXT`.
    base_allocation: bool,
}

impl Handshake {
    /// A handshake that will offer `export`, without TLS.
    pub fn new(export: ExportInfo) -> Self {
        Self::with_tls(export, TlsMode::Off)
    }

    /// A handshake that will offer `export` with TLS as `tls` says.
    pub fn with_tls(export: ExportInfo, tls: TlsMode) -> Self {
        Handshake {
            export,
            state: State::ClientFlags,
            no_zeroes: false,
            structured: false,
            shutting_down: false,
            options_seen: 0,
            tls,
            tls_active: false,
            base_allocation: false,
        }
    }

    /// The driver finished the TLS handshake after [`Step::StartTls`]: negotiation goes on
    /// inside TLS, with nothing kept from before ("the server MUST NOT preserve any
    /// negotiation state (such as a request for NBD_OPT_STRUCTURED_REPLY ...) issued before
    /// this command").
    pub fn tls_started(&mut self) {
        self.tls_active = true;
        self.structured = false;
        self.base_allocation = false;
    }

    /// Whether TLS has been initiated on this connection.
    pub fn tls_active(&self) -> bool {
        self.tls_active
    }

    /// The server's first 18 bytes: NBDMAGIC, IHAVEOPT, handshake flags.
    pub fn greeting(&self) -> [u8; 18] {
        let mut g = [0u8; 18];
        g[..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
        g[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
        g[16..].copy_from_slice(&(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES).to_be_bytes());
        g
    }

    /// From now on, answer options (other than ABORT) with `NBD_REP_ERR_SHUTDOWN`: "If the
    /// server is in the process of being shut down it ... SHOULD error further options
    /// received (other than an NBD_OPT_ABORT) with NBD_REP_ERR_SHUTDOWN."
    pub fn set_shutting_down(&mut self) {
        self.shutting_down = true;
    }

    /// How many bytes the next [`Handshake::feed`] needs (may be 0 for an empty option).
    pub fn wants(&self) -> usize {
        match self.state {
            State::ClientFlags => 4,
            State::OptionHeader => 16,
            State::OptionData { len, .. } => len as usize,
            State::Done => 0,
        }
    }

    /// Consumes exactly [`Handshake::wants`] bytes and appends the reply bytes to `out`.
    ///
    /// # Errors
    /// A [`ProtocolViolation`] when the client broke a MUST of the spec (or sent input too
    /// large to be anything but an attack); the driver closes the connection without reply.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<Step, ProtocolViolation> {
        if input.len() != self.wants() {
            return Err(ProtocolViolation::ShortInput {
                wanted: self.wants(),
                got: input.len(),
            });
        }
        match self.state {
            State::ClientFlags => {
                let flags = be_u32(input, 0);
                // "the server MUST drop the TCP connection if the client sets an unknown
                // flag, or a flag that does not match something advertised by the server."
                if flags & !(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES) != 0 {
                    return Err(ProtocolViolation::UnknownClientFlags(flags));
                }
                self.no_zeroes = flags & NBD_FLAG_C_NO_ZEROES != 0;
                self.state = State::OptionHeader;
                Ok(Step::Continue)
            }
            State::OptionHeader => {
                let magic = be_u64(input, 0);
                if magic != IHAVEOPT {
                    return Err(ProtocolViolation::BadOptionMagic(magic));
                }
                self.options_seen += 1;
                if self.options_seen > MAX_OPTIONS {
                    return Err(ProtocolViolation::TooManyOptions(MAX_OPTIONS));
                }
                let option = be_u32(input, 8);
                let len = be_u32(input, 12);
                if len > MAX_OPTION_BYTES {
                    return Err(ProtocolViolation::OptionTooLarge { option, len });
                }
                self.state = State::OptionData { option, len };
                if len == 0 {
                    return self.feed(&[], out);
                }
                Ok(Step::Continue)
            }
            State::OptionData { option, .. } => {
                self.state = State::OptionHeader;
                self.option(option, input, out)
            }
            State::Done => Err(ProtocolViolation::HandshakeOver),
        }
    }

    fn option(
        &mut self,
        option: u32,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Step, ProtocolViolation> {
        if option == NBD_OPT_ABORT {
            // "The server MUST reply with NBD_REP_ACK."
            reply(out, option, NBD_REP_ACK, &[]);
            self.state = State::Done;
            return Ok(Step::Close);
        }
        if self.shutting_down {
            if option == NBD_OPT_EXPORT_NAME {
                // EXPORT_NAME cannot be errored: terminate the session.
                self.state = State::Done;
                return Ok(Step::Close);
            }
            error(
                out,
                option,
                NBD_REP_ERR_SHUTDOWN,
                "the server is shutting down",
            );
            return Ok(Step::Continue);
        }
        if option == NBD_OPT_STARTTLS && self.tls != TlsMode::Off {
            return Ok(self.starttls(data, out));
        }
        if self.tls == TlsMode::Require && !self.tls_active {
            if option == NBD_OPT_EXPORT_NAME {
                // FORCEDTLS: "If the server receives a request to enter transmission mode
                // via NBD_OPT_EXPORT_NAME when TLS has not been initiated, then as this
                // request cannot error, it MUST terminate the session."
                self.state = State::Done;
                return Ok(Step::Close);
            }
            // "If the server receives any other option, including NBD_OPT_INFO and
            // unsupported options, it MUST reply with NBD_REP_ERR_TLS_REQD if TLS has not
            // been initiated" (and NBD_OPT_GO "MUST error with NBD_REP_ERR_TLS_REQD").
            error(
                out,
                option,
                NBD_REP_ERR_TLS_REQD,
                "TLS is required: send NBD_OPT_STARTTLS first",
            );
            return Ok(Step::Continue);
        }
        match option {
            NBD_OPT_EXPORT_NAME => {
                // "If the chosen export does not exist ... the server MUST terminate the
                // session."
                if !self.name_matches(data) {
                    self.state = State::Done;
                    return Ok(Step::Close);
                }
                let flags = self.flags();
                out.extend_from_slice(&self.export.size_bytes.to_be_bytes());
                out.extend_from_slice(&flags.to_be_bytes());
                if !self.no_zeroes {
                    out.extend_from_slice(&[0u8; 124]);
                }
                self.state = State::Done;
                Ok(Step::Transmission(Negotiated {
                    structured_replies: self.structured,
                    flags,
                    block_size_agreed: false,
                    base_allocation: self.base_allocation && self.structured,
                }))
            }
            NBD_OPT_LIST => {
                if !data.is_empty() {
                    // The spec's own example of NBD_REP_ERR_INVALID.
                    error(
                        out,
                        option,
                        NBD_REP_ERR_INVALID,
                        "NBD_OPT_LIST takes no data",
                    );
                    return Ok(Step::Continue);
                }
                let name = self.export.name.as_bytes();
                let mut payload =
                    Vec::with_capacity(4 + name.len() + self.export.description.len());
                payload.extend_from_slice(&(name.len() as u32).to_be_bytes());
                payload.extend_from_slice(name);
                payload.extend_from_slice(self.export.description.as_bytes());
                reply(out, option, NBD_REP_SERVER, &payload);
                reply(out, option, NBD_REP_ACK, &[]);
                Ok(Step::Continue)
            }
            NBD_OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    error(
                        out,
                        option,
                        NBD_REP_ERR_INVALID,
                        "NBD_OPT_STRUCTURED_REPLY takes no data",
                    );
                    return Ok(Step::Continue);
                }
                self.structured = true;
                reply(out, option, NBD_REP_ACK, &[]);
                Ok(Step::Continue)
            }
            NBD_OPT_INFO | NBD_OPT_GO => self.info_or_go(option, data, out),
            NBD_OPT_LIST_META_CONTEXT | NBD_OPT_SET_META_CONTEXT => {
                self.meta_context(option, data, out);
                Ok(Step::Continue)
            }
            // NOTLS mode: "If the server receives NBD_OPT_STARTTLS it MUST respond with
            // NBD_REP_ERR_POLICY ... [or] NBD_REP_ERR_UNSUP".
            _ => {
                error(
                    out,
                    option,
                    NBD_REP_ERR_UNSUP,
                    "option not supported by this server",
                );
                Ok(Step::Continue)
            }
        }
    }

    /// `NBD_OPT_STARTTLS` with TLS offered.
    fn starttls(&mut self, data: &[u8], out: &mut Vec<u8>) -> Step {
        let option = NBD_OPT_STARTTLS;
        if self.tls_active {
            // "If the server receives NBD_OPT_STARTTLS when TLS has already been
            // negotiated, it MUST reply with NBD_REP_ERR_INVALID."
            error(out, option, NBD_REP_ERR_INVALID, "TLS is already active");
            return Step::Continue;
        }
        if !data.is_empty() {
            // "The client MUST NOT send any additional data with the option" (the spec's
            // own example: "NBD_REP_ERR_INVALID if the client included data").
            error(
                out,
                option,
                NBD_REP_ERR_INVALID,
                "NBD_OPT_STARTTLS takes no data",
            );
            return Step::Continue;
        }
        // "If the server receives NBD_OPT_STARTTLS prior to negotiating TLS, it MUST reply
        // with NBD_REP_ACK."
        reply(out, option, NBD_REP_ACK, &[]);
        Step::StartTls
    }

    fn info_or_go(
        &mut self,
        option: u32,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Step, ProtocolViolation> {
        // Data: 32-bit name length, name, 16-bit number of information requests, 16 bits each.
        let Some((name, requests)) = parse_info_request(data) else {
            error(
                out,
                option,
                NBD_REP_ERR_INVALID,
                "malformed NBD_OPT_INFO/GO data",
            );
            return Ok(Step::Continue);
        };
        if !self.name_matches(name) {
            error(out, option, NBD_REP_ERR_UNKNOWN, "no such export");
            return Ok(Step::Continue);
        }
        let flags = self.flags();
        let mut export = Vec::with_capacity(12);
        export.extend_from_slice(&NBD_INFO_EXPORT.to_be_bytes());
        export.extend_from_slice(&self.export.size_bytes.to_be_bytes());
        export.extend_from_slice(&flags.to_be_bytes());
        reply(out, option, NBD_REP_INFO, &export);
        let asked = |t: u16| requests.contains(&t);
        if asked(NBD_INFO_NAME) {
            let mut p = NBD_INFO_NAME.to_be_bytes().to_vec();
            p.extend_from_slice(self.export.name.as_bytes());
            reply(out, option, NBD_REP_INFO, &p);
        }
        if asked(NBD_INFO_DESCRIPTION) && !self.export.description.is_empty() {
            let mut p = NBD_INFO_DESCRIPTION.to_be_bytes().to_vec();
            p.extend_from_slice(self.export.description.as_bytes());
            reply(out, option, NBD_REP_INFO, &p);
        }
        // Sent whether asked or not (as nbdkit and qemu-nbd do): "The server MUST send this
        // info if it is requested and it intends to enforce block size constraints other
        // than the defaults"; clients ignore information they did not ask for.
        let mut bs = Vec::with_capacity(14);
        bs.extend_from_slice(&NBD_INFO_BLOCK_SIZE.to_be_bytes());
        bs.extend_from_slice(&self.export.min_block.to_be_bytes());
        bs.extend_from_slice(&self.export.preferred_block.to_be_bytes());
        bs.extend_from_slice(&self.export.max_block.to_be_bytes());
        reply(out, option, NBD_REP_INFO, &bs);
        reply(out, option, NBD_REP_ACK, &[]);
        if option == NBD_OPT_GO {
            self.state = State::Done;
            return Ok(Step::Transmission(Negotiated {
                structured_replies: self.structured,
                flags,
                block_size_agreed: asked(NBD_INFO_BLOCK_SIZE),
                base_allocation: self.base_allocation && self.structured,
            }));
        }
        Ok(Step::Continue)
    }

    /// `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT` ("Metadata querying"):
    /// the one context offered is `base:allocation`. LIST with no queries, or a query of
    /// `base:` or `base:allocation`, names it; SET selects it when a query is exactly
    /// `base:allocation` and otherwise selects nothing (each SET replaces the last).
    fn meta_context(&mut self, option: u32, data: &[u8], out: &mut Vec<u8>) {
        let set = option == NBD_OPT_SET_META_CONTEXT;
        // "The server MUST reply with NBD_REP_ERR_INVALID ... if the client has not
        // negotiated structured replies" (nbdkit and qemu-nbd do the same for LIST).
        if !self.structured {
            error(
                out,
                option,
                NBD_REP_ERR_INVALID,
                "negotiate structured replies (NBD_OPT_STRUCTURED_REPLY) first",
            );
            return;
        }
        let Some((name, queries)) = parse_meta_request(data) else {
            error(
                out,
                option,
                NBD_REP_ERR_INVALID,
                "malformed NBD_OPT_LIST/SET_META_CONTEXT data",
            );
            return;
        };
        if !self.name_matches(name) {
            error(out, option, NBD_REP_ERR_UNKNOWN, "no such export");
            return;
        }
        let matches = if set {
            queries.iter().any(|q| *q == BASE_ALLOCATION.as_bytes())
        } else {
            queries.is_empty()
                || queries
                    .iter()
                    .any(|q| *q == b"base:" || *q == BASE_ALLOCATION.as_bytes())
        };
        if set {
            self.base_allocation = matches;
        }
        if matches {
            let mut p = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
            p.extend_from_slice(BASE_ALLOCATION.as_bytes());
            reply(out, option, NBD_REP_META_CONTEXT, &p);
        }
        reply(out, option, NBD_REP_ACK, &[]);
    }

    fn name_matches(&self, name: &[u8]) -> bool {
        name.is_empty() || name == self.export.name.as_bytes()
    }

    /// The transmission flags as of now: `NBD_FLAG_SEND_DF` only with structured replies
    /// ("MUST leave this flag clear if structured replies have not been negotiated").
    fn flags(&self) -> u16 {
        let mut f = self.export.flags | NBD_FLAG_HAS_FLAGS;
        if self.structured {
            f |= NBD_FLAG_SEND_DF;
        } else {
            f &= !NBD_FLAG_SEND_DF;
        }
        f
    }
}

/// Splits LIST/SET_META_CONTEXT data (32-bit name length, name, 32-bit query count, then
/// each query as a 32-bit length and its bytes) into the export name and the queries;
/// `None` if the lengths do not add up exactly or a string exceeds the spec's 4096 bytes.
fn parse_meta_request(data: &[u8]) -> Option<(&[u8], Vec<&[u8]>)> {
    let take_u32 = |d: &[u8], at: usize| -> Option<usize> {
        d.get(at..at + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let name_len = take_u32(data, 0)?;
    if name_len > 4096 {
        return None;
    }
    let name = data.get(4..4 + name_len)?;
    let mut at = 4 + name_len;
    let count = take_u32(data, at)?;
    at += 4;
    let mut queries = Vec::new();
    for _ in 0..count {
        let len = take_u32(data, at)?;
        if len > 4096 {
            return None;
        }
        queries.push(data.get(at + 4..at + 4 + len)?);
        at += 4 + len;
    }
    (at == data.len()).then_some((name, queries))
}

/// Splits INFO/GO data into the export name and the information requests; `None` if the
/// lengths do not add up exactly.
fn parse_info_request(data: &[u8]) -> Option<(&[u8], Vec<u16>)> {
    let name_len = usize::try_from(u32::from_be_bytes(data.get(..4)?.try_into().ok()?)).ok()?;
    let name_end = 4usize.checked_add(name_len)?;
    let name = data.get(4..name_end)?;
    let count = u16::from_be_bytes(data.get(name_end..name_end + 2)?.try_into().ok()?) as usize;
    let rest = data.get(name_end + 2..)?;
    if rest.len() != count * 2 {
        return None;
    }
    let requests = rest
        .chunks_exact(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect();
    Some((name, requests))
}

fn reply(out: &mut Vec<u8>, option: u32, kind: u32, data: &[u8]) {
    out.extend_from_slice(&NBD_REP_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

fn error(out: &mut Vec<u8>, option: u32, kind: u32, message: &str) {
    reply(out, option, kind, message.as_bytes());
}

fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export() -> ExportInfo {
        ExportInfo {
            name: "vol".into(),
            description: "test volume".into(),
            size_bytes: 1 << 20,
            flags: NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH,
            min_block: 4096,
            preferred_block: 4096,
            max_block: 32 << 20,
        }
    }

    fn opt(option: u32, data: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let mut h = Vec::new();
        h.extend_from_slice(&IHAVEOPT.to_be_bytes());
        h.extend_from_slice(&option.to_be_bytes());
        h.extend_from_slice(&(data.len() as u32).to_be_bytes());
        (h, data.to_vec())
    }

    /// Drives a handshake through client flags and the given options.
    fn run(opts: &[(u32, Vec<u8>)]) -> (Vec<u8>, Result<Step, ProtocolViolation>) {
        let mut hs = Handshake::new(export());
        let mut out = Vec::new();
        assert_eq!(hs.feed(&1u32.to_be_bytes(), &mut out), Ok(Step::Continue));
        let mut last = Ok(Step::Continue);
        for (o, d) in opts {
            let (h, d) = opt(*o, d);
            last = hs.feed(&h, &mut out);
            if last == Ok(Step::Continue) && !d.is_empty() {
                last = hs.feed(&d, &mut out);
            }
        }
        (out, last)
    }

    fn go_data(name: &str, infos: &[u16]) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
        for i in infos {
            d.extend_from_slice(&i.to_be_bytes());
        }
        d
    }

    /// Splits option replies into (option, type, data).
    fn replies(mut b: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
        let mut v = Vec::new();
        while !b.is_empty() {
            assert_eq!(be_u64(b, 0), NBD_REP_MAGIC);
            let len = be_u32(b, 16) as usize;
            v.push((be_u32(b, 8), be_u32(b, 12), b[20..20 + len].to_vec()));
            b = &b[20 + len..];
        }
        v
    }

    #[test]
    fn greeting_offers_fixed_newstyle_and_no_zeroes() {
        let g = Handshake::new(export()).greeting();
        assert_eq!(&g[..16], b"NBDMAGICIHAVEOPT");
        assert_eq!(&g[16..], &[0, 3]);
    }

    #[test]
    fn unknown_client_flags_close_the_connection() {
        let mut hs = Handshake::new(export());
        assert_eq!(
            hs.feed(&4u32.to_be_bytes(), &mut Vec::new()),
            Err(ProtocolViolation::UnknownClientFlags(4))
        );
    }

    #[test]
    fn go_sends_export_and_block_size_then_ack() {
        let (out, step) = run(&[(NBD_OPT_GO, go_data("", &[NBD_INFO_BLOCK_SIZE]))]);
        let r = replies(&out);
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].1, NBD_REP_INFO);
        assert_eq!(&r[0].2[..2], &NBD_INFO_EXPORT.to_be_bytes());
        assert_eq!(be_u64(&r[0].2, 2), 1 << 20);
        assert_eq!(r[1].2[..2], NBD_INFO_BLOCK_SIZE.to_be_bytes());
        assert_eq!(be_u32(&r[1].2, 2), 4096);
        assert_eq!(be_u32(&r[1].2, 10), 32 << 20);
        assert_eq!(r[2].1, NBD_REP_ACK);
        let Ok(Step::Transmission(n)) = step else {
            panic!("{step:?}")
        };
        assert!(n.block_size_agreed && !n.structured_replies);
        assert_eq!(n.flags & NBD_FLAG_SEND_DF, 0);
    }

    #[test]
    fn structured_reply_then_go_advertises_df() {
        let (_, step) = run(&[
            (NBD_OPT_STRUCTURED_REPLY, vec![]),
            (NBD_OPT_GO, go_data("vol", &[])),
        ]);
        let Ok(Step::Transmission(n)) = step else {
            panic!("{step:?}")
        };
        assert!(n.structured_replies);
        assert_ne!(n.flags & NBD_FLAG_SEND_DF, 0);
    }

    #[test]
    fn info_does_not_end_the_handshake() {
        let (out, step) = run(&[(
            NBD_OPT_INFO,
            go_data("", &[NBD_INFO_NAME, NBD_INFO_DESCRIPTION]),
        )]);
        assert_eq!(step, Ok(Step::Continue));
        let r = replies(&out);
        assert_eq!(&r[1].2[2..], b"vol");
        assert_eq!(&r[2].2[2..], b"test volume");
        assert_eq!(r.last().map(|x| x.1), Some(NBD_REP_ACK));
    }

    #[test]
    fn go_for_an_unknown_export_is_err_unknown() {
        let (out, step) = run(&[(NBD_OPT_GO, go_data("other", &[]))]);
        assert_eq!(step, Ok(Step::Continue));
        assert_eq!(replies(&out)[0].1, NBD_REP_ERR_UNKNOWN);
    }

    #[test]
    fn malformed_go_data_is_err_invalid() {
        let mut d = go_data("", &[1]);
        d.push(0);
        let (out, _) = run(&[(NBD_OPT_GO, d)]);
        assert_eq!(replies(&out)[0].1, NBD_REP_ERR_INVALID);
        let (out, _) = run(&[(NBD_OPT_GO, vec![0, 0, 1, 0])]);
        assert_eq!(replies(&out)[0].1, NBD_REP_ERR_INVALID);
    }

    #[test]
    fn list_names_the_export() {
        let (out, _) = run(&[(NBD_OPT_LIST, vec![])]);
        let r = replies(&out);
        assert_eq!(r[0].1, NBD_REP_SERVER);
        assert_eq!(be_u32(&r[0].2, 0), 3);
        assert_eq!(&r[0].2[4..7], b"vol");
        assert_eq!(r[1].1, NBD_REP_ACK);
        let (out, _) = run(&[(NBD_OPT_LIST, vec![1])]);
        assert_eq!(replies(&out)[0].1, NBD_REP_ERR_INVALID);
    }

    #[test]
    fn abort_is_acked_and_closes() {
        let (out, step) = run(&[(NBD_OPT_ABORT, vec![])]);
        assert_eq!(step, Ok(Step::Close));
        assert_eq!(replies(&out)[0].1, NBD_REP_ACK);
    }

    fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for q in queries {
            d.extend_from_slice(&(q.len() as u32).to_be_bytes());
            d.extend_from_slice(q.as_bytes());
        }
        d
    }

    /// The contexts named in META_CONTEXT replies, and the final reply type.
    fn contexts(out: &[u8]) -> (Vec<(u32, String)>, u32) {
        let r = replies(out);
        let named = r
            .iter()
            .filter(|(_, k, _)| *k == NBD_REP_META_CONTEXT)
            .map(|(_, _, d)| (be_u32(d, 0), String::from_utf8(d[4..].to_vec()).unwrap()))
            .collect();
        (named, r.last().unwrap().1)
    }

    #[test]
    fn meta_contexts_need_structured_replies_and_offer_base_allocation() {
        let base = || (BASE_ALLOCATION_ID, BASE_ALLOCATION.to_string());
        // Without structured replies: NBD_REP_ERR_INVALID, nothing selected.
        let (out, _) = run(&[(NBD_OPT_SET_META_CONTEXT, meta_data("", &[BASE_ALLOCATION]))]);
        assert_eq!(contexts(&out), (vec![], NBD_REP_ERR_INVALID));
        let sr = (NBD_OPT_STRUCTURED_REPLY, vec![]);
        // LIST: no query lists everything; "base:" the namespace; others nothing.
        for (q, named) in [
            (&[][..], true),
            (&["base:"][..], true),
            (&["base:allocation"][..], true),
            (&["qemu:dirty-bitmap:x"][..], false),
        ] {
            let (out, _) = run(&[sr.clone(), (NBD_OPT_LIST_META_CONTEXT, meta_data("vol", q))]);
            let (c, last) = contexts(&out);
            assert_eq!(last, NBD_REP_ACK, "{q:?}");
            assert_eq!(c, if named { vec![base()] } else { vec![] }, "{q:?}");
        }
        // SET base:allocation, then GO: block status is on.
        let (out, step) = run(&[
            sr.clone(),
            (
                NBD_OPT_SET_META_CONTEXT,
                meta_data("", &["qemu:x", BASE_ALLOCATION]),
            ),
            (NBD_OPT_GO, go_data("", &[])),
        ]);
        assert_eq!(contexts(&out).0, vec![base()]);
        let Ok(Step::Transmission(n)) = step else {
            panic!("{step:?}")
        };
        assert!(n.base_allocation && n.structured_replies);
        // A later SET without it deselects it; an unknown export is NBD_REP_ERR_UNKNOWN;
        // a query count that overruns the data is NBD_REP_ERR_INVALID.
        let (_, step) = run(&[
            sr.clone(),
            (NBD_OPT_SET_META_CONTEXT, meta_data("", &[BASE_ALLOCATION])),
            (NBD_OPT_SET_META_CONTEXT, meta_data("", &[])),
            (NBD_OPT_GO, go_data("", &[])),
        ]);
        assert!(matches!(step, Ok(Step::Transmission(n)) if !n.base_allocation));
        let (out, _) = run(&[
            sr.clone(),
            (NBD_OPT_SET_META_CONTEXT, meta_data("other", &[])),
        ]);
        assert_eq!(contexts(&out).1, NBD_REP_ERR_UNKNOWN);
        let mut bad = meta_data("", &[BASE_ALLOCATION]);
        bad.truncate(bad.len() - 1);
        let (out, _) = run(&[sr, (NBD_OPT_SET_META_CONTEXT, bad)]);
        assert_eq!(contexts(&out).1, NBD_REP_ERR_INVALID);
    }

    #[test]
    fn starttls_and_unknown_options_are_unsupported() {
        for o in [NBD_OPT_STARTTLS, 999] {
            let (out, step) = run(&[(o, vec![])]);
            assert_eq!(step, Ok(Step::Continue));
            assert_eq!(replies(&out)[0].1, NBD_REP_ERR_UNSUP);
        }
    }

    #[test]
    fn export_name_sends_size_flags_and_zeroes() {
        let (out, step) = run(&[(NBD_OPT_EXPORT_NAME, b"vol".to_vec())]);
        assert!(matches!(step, Ok(Step::Transmission(_))));
        assert_eq!(out.len(), 8 + 2 + 124);
        assert_eq!(be_u64(&out, 0), 1 << 20);
        let (out, step) = run(&[(NBD_OPT_EXPORT_NAME, b"nope".to_vec())]);
        assert_eq!((out.len(), step), (0, Ok(Step::Close)));
    }

    #[test]
    fn no_zeroes_drops_the_padding() {
        let mut hs = Handshake::new(export());
        let mut out = Vec::new();
        hs.feed(&3u32.to_be_bytes(), &mut out).unwrap();
        let (h, _) = opt(NBD_OPT_EXPORT_NAME, b"");
        assert!(matches!(hs.feed(&h, &mut out), Ok(Step::Transmission(_))));
        assert_eq!(out.len(), 10);
    }

    #[test]
    fn shutting_down_errors_options_but_acks_abort() {
        let mut hs = Handshake::new(export());
        let mut out = Vec::new();
        hs.feed(&1u32.to_be_bytes(), &mut out).unwrap();
        hs.set_shutting_down();
        let (h, _) = opt(NBD_OPT_LIST, b"");
        assert_eq!(hs.feed(&h, &mut out), Ok(Step::Continue));
        assert_eq!(replies(&out)[0].1, NBD_REP_ERR_SHUTDOWN);
    }

    #[test]
    fn oversized_option_is_a_violation_not_an_allocation() {
        let mut hs = Handshake::new(export());
        let mut out = Vec::new();
        hs.feed(&1u32.to_be_bytes(), &mut out).unwrap();
        let mut h = IHAVEOPT.to_be_bytes().to_vec();
        h.extend_from_slice(&NBD_OPT_GO.to_be_bytes());
        h.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            hs.feed(&h, &mut out),
            Err(ProtocolViolation::OptionTooLarge { .. })
        ));
    }

    /// Client flags, then each option (header and data) fed to `hs`.
    fn feed_opts(hs: &mut Handshake, opts: &[(u32, Vec<u8>)]) -> (Vec<u8>, Vec<Step>) {
        let mut out = Vec::new();
        let mut steps = Vec::new();
        if hs.state == State::ClientFlags {
            hs.feed(&1u32.to_be_bytes(), &mut out).unwrap();
        }
        for (o, d) in opts {
            let (h, d) = opt(*o, d);
            let mut step = hs.feed(&h, &mut out).unwrap();
            if step == Step::Continue && !d.is_empty() {
                step = hs.feed(&d, &mut out).unwrap();
            }
            steps.push(step);
        }
        (out, steps)
    }

    #[test]
    fn starttls_is_acked_when_tls_is_offered() {
        for mode in [TlsMode::On, TlsMode::Require] {
            let mut hs = Handshake::with_tls(export(), mode);
            let (out, steps) = feed_opts(&mut hs, &[(NBD_OPT_STARTTLS, vec![])]);
            assert_eq!(steps, [Step::StartTls]);
            assert_eq!(replies(&out), [(NBD_OPT_STARTTLS, NBD_REP_ACK, vec![])]);
        }
    }

    #[test]
    fn tls_on_still_serves_plaintext_clients() {
        let mut hs = Handshake::with_tls(export(), TlsMode::On);
        let (_, steps) = feed_opts(&mut hs, &[(NBD_OPT_GO, go_data("", &[]))]);
        assert!(matches!(steps[0], Step::Transmission(_)));
    }

    #[test]
    fn tls_require_refuses_every_option_but_starttls_and_abort() {
        for o in [
            NBD_OPT_LIST,
            NBD_OPT_INFO,
            NBD_OPT_GO,
            NBD_OPT_STRUCTURED_REPLY,
            NBD_OPT_SET_META_CONTEXT,
            999,
        ] {
            let mut hs = Handshake::with_tls(export(), TlsMode::Require);
            let data = if o == NBD_OPT_GO || o == NBD_OPT_INFO {
                go_data("", &[])
            } else {
                vec![]
            };
            let (out, steps) = feed_opts(&mut hs, &[(o, data)]);
            assert_eq!(steps, [Step::Continue], "option {o}");
            assert_eq!(replies(&out)[0].1, NBD_REP_ERR_TLS_REQD, "option {o}");
        }
        let mut hs = Handshake::with_tls(export(), TlsMode::Require);
        let (out, steps) = feed_opts(&mut hs, &[(NBD_OPT_EXPORT_NAME, vec![])]);
        assert_eq!((out.len(), steps), (0, vec![Step::Close]));
        let mut hs = Handshake::with_tls(export(), TlsMode::Require);
        let (out, steps) = feed_opts(&mut hs, &[(NBD_OPT_ABORT, vec![])]);
        assert_eq!(steps, [Step::Close]);
        assert_eq!(replies(&out)[0].1, NBD_REP_ACK);
    }

    #[test]
    fn after_tls_options_work_and_earlier_state_is_forgotten() {
        let mut hs = Handshake::with_tls(export(), TlsMode::Require);
        let (_, steps) = feed_opts(&mut hs, &[(NBD_OPT_STARTTLS, vec![])]);
        assert_eq!(steps, [Step::StartTls]);
        hs.tls_started();
        assert!(hs.tls_active());
        let (out, steps) = feed_opts(
            &mut hs,
            &[(NBD_OPT_STARTTLS, vec![]), (NBD_OPT_LIST, vec![])],
        );
        let r = replies(&out);
        assert_eq!(r[0].1, NBD_REP_ERR_INVALID, "STARTTLS twice");
        assert_eq!(r[1].1, NBD_REP_SERVER);
        assert_eq!(steps[1], Step::Continue);
        let (_, steps) = feed_opts(&mut hs, &[(NBD_OPT_GO, go_data("vol", &[]))]);
        assert!(matches!(steps[0], Step::Transmission(_)));
    }

    #[test]
    fn structured_replies_asked_before_starttls_are_not_kept() {
        let mut hs = Handshake::with_tls(export(), TlsMode::On);
        feed_opts(
            &mut hs,
            &[
                (NBD_OPT_STRUCTURED_REPLY, vec![]),
                (NBD_OPT_STARTTLS, vec![]),
            ],
        );
        hs.tls_started();
        let (_, steps) = feed_opts(&mut hs, &[(NBD_OPT_GO, go_data("", &[]))]);
        let Step::Transmission(n) = steps[0] else {
            panic!("{steps:?}")
        };
        assert!(!n.structured_replies);
    }

    #[test]
    fn starttls_with_data_is_err_invalid() {
        let mut hs = Handshake::with_tls(export(), TlsMode::On);
        let (out, steps) = feed_opts(&mut hs, &[(NBD_OPT_STARTTLS, vec![1])]);
        assert_eq!(steps, [Step::Continue]);
        assert_eq!(replies(&out)[0].1, NBD_REP_ERR_INVALID);
    }
}
