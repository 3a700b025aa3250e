//! An incremental `text/event-stream` parser with a per-event size bound: bytes in as they
//! arrive, complete events out, never more than the bound buffered for one event.

use std::collections::VecDeque;

/// One dispatched event: its type (`None` for the default `message`) and its `data` lines
/// joined by `\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Event {
    /// The `event:` field, when one was sent.
    pub kind: Option<String>,
    /// The joined `data:` lines.
    pub data: Vec<u8>,
}

impl Event {
    /// Whether this is a `message` event (the only type MCP sends JSON-RPC messages in).
    pub fn is_message(&self) -> bool {
        self.kind.as_deref().is_none_or(|kind| kind == "message")
    }
}

/// An event (or one line of it) grew beyond the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct EventTooLarge;

/// The parser state: the line being read, the event being assembled, events ready to take.
#[derive(Debug)]
pub(super) struct Parser {
    max_event_bytes: usize,
    line: Vec<u8>,
    skip_lf: bool,
    data: Vec<u8>,
    has_data: bool,
    kind: Option<String>,
    ready: VecDeque<Event>,
}

impl Parser {
    /// A parser refusing any event (its lines and data together) above `max_event_bytes`.
    pub fn new(max_event_bytes: usize) -> Self {
        Self {
            max_event_bytes,
            line: Vec::new(),
            skip_lf: false,
            data: Vec::new(),
            has_data: false,
            kind: None,
            ready: VecDeque::new(),
        }
    }

    /// Feeds bytes; complete events become available through [`Parser::next_event`]. Lines end
    /// at `\n`, `\r\n` or `\r` (also across chunk boundaries).
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), EventTooLarge> {
        for &byte in chunk {
            if std::mem::take(&mut self.skip_lf) && byte == b'\n' {
                continue;
            }
            match byte {
                b'\n' => self.end_line()?,
                b'\r' => {
                    self.end_line()?;
                    self.skip_lf = true;
                }
                _ => {
                    self.line.push(byte);
                    if self.line.len() + self.data.len() > self.max_event_bytes {
                        return Err(EventTooLarge);
                    }
                }
            }
        }
        Ok(())
    }

    /// The next complete event, oldest first.
    pub fn next_event(&mut self) -> Option<Event> {
        self.ready.pop_front()
    }

    fn end_line(&mut self) -> Result<(), EventTooLarge> {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            if self.has_data {
                let mut data = std::mem::take(&mut self.data);
                if data.last() == Some(&b'\n') {
                    data.pop();
                }
                self.ready.push_back(Event { kind: self.kind.take(), data });
            }
            self.has_data = false;
            self.data.clear();
            self.kind = None;
            return Ok(());
        }
        if line.first() == Some(&b':') {
            return Ok(());
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (&line[..], &[][..]),
        };
        match field {
            b"data" => {
                self.data.extend_from_slice(value);
                self.data.push(b'\n');
                self.has_data = true;
                if self.data.len() > self.max_event_bytes {
                    return Err(EventTooLarge);
                }
            }
            b"event" => self.kind = Some(String::from_utf8_lossy(value).into_owned()),
            // `id` and `retry` serve resumption, which this client does not use.
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(input: &[&[u8]]) -> Vec<Event> {
        let mut parser = Parser::new(1024);
        let mut out = Vec::new();
        for chunk in input {
            parser.push(chunk).unwrap();
            while let Some(event) = parser.next_event() {
                out.push(event);
            }
        }
        out
    }

    #[test]
    fn splits_events_across_chunks_and_line_endings() {
        let got =
            events(&[b"data: {\"a\"", b":1}\r", b"\n\r\n: comment\nevent: x\ndata:a\ndata: b\n\n", b"id: 3\ndata"]);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0], Event { kind: None, data: b"{\"a\":1}".to_vec() });
        assert_eq!(got[1], Event { kind: Some("x".into()), data: b"a\nb".to_vec() });
        assert!(!got[1].is_message());
    }

    #[test]
    fn events_without_data_are_not_dispatched() {
        assert!(events(&[b"id: 1\n\nretry: 5\n\n"]).is_empty());
        assert_eq!(events(&[b"data\n\n"]), vec![Event { kind: None, data: Vec::new() }]);
    }

    #[test]
    fn an_oversized_event_is_refused() {
        let mut parser = Parser::new(8);
        assert_eq!(parser.push(b"data: 0123456789\n"), Err(EventTooLarge));
        let mut parser = Parser::new(8);
        assert_eq!(parser.push(b"data: 0123\ndata: 4567\n"), Err(EventTooLarge));
    }
}
