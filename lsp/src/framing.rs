//! The base protocol's framing, in front of tower-lsp's transport.
//!
//! tower-lsp's reader stops at the first message it cannot decode (its framed
//! stream ends after an error), so one malformed message ended the server.
//! Here the input is read frame by frame (`Content-Length` headers, a body of
//! that many bytes, however the reads split it); a body that is not JSON is
//! answered with JSON-RPC's parse error (-32700), a JSON body that is not a
//! JSON-RPC 2.0 request, notification or response with invalid request
//! (-32600), as the JSON-RPC 2.0 specification says, and only well-formed
//! messages are passed on. Headers without a usable `Content-Length` are a
//! parse error too, and reading resumes at the next `Content-Length`. The
//! server's own messages and these answers reach the output through one
//! writer, a whole message at a time.

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// JSON-RPC's "Parse error": the body is not JSON.
pub const PARSE_ERROR: i64 = -32700;
/// JSON-RPC's "Invalid Request": JSON, but not a JSON-RPC message.
pub const INVALID_REQUEST: i64 = -32600;

/// Largest header block accepted; a longer one is garbage (no message has
/// headers of this size), skipped to the next `Content-Length`.
const MAX_HEADERS: usize = 8 * 1024;

/// What one frame's body is.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// A JSON-RPC message: pass it on.
    Message,
    /// Answer with this error response and go on.
    Reject(Value),
}

/// The error response with `code` for the request `id` (`null` when unknown).
fn error_response(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// Classifies a frame's body.
pub fn judge(body: &[u8]) -> Verdict {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return Verdict::Reject(error_response(Value::Null, PARSE_ERROR, "Parse error"));
    };
    let invalid = |id: Value, why: &str| {
        Verdict::Reject(error_response(
            id,
            INVALID_REQUEST,
            &format!("Invalid Request: {why}"),
        ))
    };
    let Value::Object(m) = &v else {
        // Batches are not part of the Language Server Protocol.
        return invalid(Value::Null, "expected a JSON object");
    };
    // The id to answer with: only a valid one (a number, a string or null).
    let id = match m.get("id") {
        Some(id @ (Value::Number(_) | Value::String(_) | Value::Null)) => Some(id.clone()),
        Some(_) => return invalid(Value::Null, "`id` must be a number, a string or null"),
        None => None,
    };
    let answer_id = id.clone().unwrap_or(Value::Null);
    if m.get("jsonrpc") != Some(&Value::String("2.0".into())) {
        return invalid(answer_id, "`jsonrpc` must be \"2.0\"");
    }
    match m.get("method") {
        Some(Value::String(_)) => match m.get("params") {
            None | Some(Value::Object(_) | Value::Array(_)) => Verdict::Message,
            Some(_) => invalid(answer_id, "`params` must be an object or an array"),
        },
        Some(_) => invalid(answer_id, "`method` must be a string"),
        // A response to one of the server's requests.
        None if id.is_some() && (m.contains_key("result") ^ m.contains_key("error")) => {
            Verdict::Message
        }
        None => invalid(answer_id, "no `method`"),
    }
}

/// One message framed for the wire.
pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = format!("Content-Length: {}\r\n\r\n", body.len()).into_bytes();
    out.extend_from_slice(body);
    out
}

/// One step of reading frames from a buffer.
#[derive(Debug, PartialEq)]
pub enum Frame {
    /// A complete body (the bytes it took are consumed).
    Body(Vec<u8>),
    /// Headers that frame nothing: answer a parse error (consumed up to the
    /// next `Content-Length`, or all of it).
    BadHeaders,
    /// More input is needed.
    Partial,
}

/// Takes the next frame off the front of `buf`.
pub fn next_frame(buf: &mut Vec<u8>) -> Frame {
    let Some(end) = find(buf, b"\r\n\r\n") else {
        if buf.len() > MAX_HEADERS {
            skip_to_next_header(buf, 1);
            return Frame::BadHeaders;
        }
        return Frame::Partial;
    };
    let headers = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut length = None;
    let mut bad = false;
    for line in headers.split("\r\n") {
        let Some((name, value)) = line.split_once(':') else {
            bad = true;
            continue;
        };
        // Header names are case-insensitive (as in HTTP).
        if name.trim().eq_ignore_ascii_case("content-length") {
            match value.trim().parse::<usize>() {
                Ok(n) => length = Some(n),
                Err(_) => bad = true,
            }
        }
    }
    match length {
        Some(n) if !bad => {
            let start = end + 4;
            if buf.len() < start + n {
                return Frame::Partial;
            }
            let body = buf[start..start + n].to_vec();
            buf.drain(..start + n);
            Frame::Body(body)
        }
        _ => {
            skip_to_next_header(buf, end + 4);
            Frame::BadHeaders
        }
    }
}

/// Drops the bytes before the next `Content-Length` at or after `from`.
fn skip_to_next_header(buf: &mut Vec<u8>, from: usize) {
    let from = from.min(buf.len());
    let at = find(&buf[from..], b"Content-Length").map_or(buf.len(), |i| from + i);
    buf.drain(..at);
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Reads frames from `input`: well-formed messages go to `server` (re-framed),
/// errors to `answers`. Ends at the end of `input`.
pub async fn read_input<I, S>(mut input: I, mut server: S, answers: mpsc::UnboundedSender<Vec<u8>>)
where
    I: AsyncRead + Unpin,
    S: AsyncWrite + Unpin,
{
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        loop {
            match next_frame(&mut buf) {
                Frame::Partial => break,
                Frame::BadHeaders => {
                    let e = error_response(
                        Value::Null,
                        PARSE_ERROR,
                        "Parse error: headers without a valid Content-Length",
                    );
                    let _ = answers.send(frame(e.to_string().as_bytes()));
                }
                Frame::Body(body) => match judge(&body) {
                    Verdict::Message => {
                        if server.write_all(&frame(&body)).await.is_err() {
                            return;
                        }
                        let _ = server.flush().await;
                    }
                    Verdict::Reject(e) => {
                        let _ = answers.send(frame(e.to_string().as_bytes()));
                    }
                },
            }
        }
        match input.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Copies the server's messages from `from` to `answers`, a whole message at a
/// time (so that they never interleave with the reader's answers).
pub async fn pump_output<R>(mut from: R, answers: mpsc::UnboundedSender<Vec<u8>>)
where
    R: AsyncRead + Unpin,
{
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        while let Frame::Body(body) = next_frame(&mut buf) {
            if answers.send(frame(&body)).is_err() {
                return;
            }
        }
        match from.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Writes each message of `messages` to `output` until every sender is gone.
pub async fn write_output<O>(mut output: O, mut messages: mpsc::UnboundedReceiver<Vec<u8>>)
where
    O: AsyncWrite + Unpin,
{
    while let Some(m) = messages.recv().await {
        if output.write_all(&m).await.is_err() || output.flush().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_judged_as_json_rpc_says() {
        let code = |b: &str| match judge(b.as_bytes()) {
            Verdict::Message => 0,
            Verdict::Reject(v) => v["error"]["code"].as_i64().unwrap(),
        };
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1,"method":"shutdown"}"#), 0);
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","method":"initialized","params":{}}"#),
            0
        );
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":"a","result":null}"#), 0);
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1,"meth"#), PARSE_ERROR);
        assert_eq!(code("not json"), PARSE_ERROR);
        assert_eq!(code(""), PARSE_ERROR);
        assert_eq!(code("[]"), INVALID_REQUEST);
        assert_eq!(code("42"), INVALID_REQUEST);
        assert_eq!(code(r#"{"id":1,"method":"x"}"#), INVALID_REQUEST);
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":7}"#),
            INVALID_REQUEST
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":[1],"method":"x"}"#),
            INVALID_REQUEST
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":"x","params":3}"#),
            INVALID_REQUEST
        );
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1}"#), INVALID_REQUEST);
        // The answer keeps a valid id.
        let Verdict::Reject(v) = judge(br#"{"jsonrpc":"2.0","id":7,"method":5}"#) else {
            panic!()
        };
        assert_eq!(v["id"], 7);
    }

    #[test]
    fn frames_survive_any_split_of_the_input() {
        let a = frame(br#"{"a":1}"#);
        let b = frame("{\"b\":\"é\"}".as_bytes());
        let all = [a.clone(), b.clone()].concat();
        // Every split point, fed in two reads.
        for cut in 0..=all.len() {
            let mut buf = all[..cut].to_vec();
            let mut got = Vec::new();
            while let Frame::Body(body) = next_frame(&mut buf) {
                got.push(body);
            }
            buf.extend_from_slice(&all[cut..]);
            while let Frame::Body(body) = next_frame(&mut buf) {
                got.push(body);
            }
            assert_eq!(
                got,
                [br#"{"a":1}"#.to_vec(), "{\"b\":\"é\"}".as_bytes().to_vec()],
                "cut {cut}"
            );
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn bad_headers_skip_to_the_next_message() {
        let mut buf = b"Content-Length: x\r\n\r\ngarbage".to_vec();
        buf.extend(frame(b"{}"));
        assert_eq!(next_frame(&mut buf), Frame::BadHeaders);
        assert_eq!(next_frame(&mut buf), Frame::Body(b"{}".to_vec()));
        let mut buf = b"Foo: 1\r\n\r\n".to_vec();
        assert_eq!(next_frame(&mut buf), Frame::BadHeaders);
        assert!(buf.is_empty());
        // Header names in any case; Content-Type allowed.
        let mut buf = b"content-length: 2\r\nContent-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n{}".to_vec();
        assert_eq!(next_frame(&mut buf), Frame::Body(b"{}".to_vec()));
        // Endless garbage without a blank line is dropped, not buffered forever.
        let mut buf = vec![b'x'; MAX_HEADERS + 1];
        assert_eq!(next_frame(&mut buf), Frame::BadHeaders);
        assert!(buf.is_empty());
    }
}
