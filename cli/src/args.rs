//! A small argument parser: positionals, `--flag`, `--key value`, `--key=value`.

use std::collections::HashMap;

/// Parsed arguments of one subcommand.
pub struct Args {
    /// Positional arguments in order.
    pub pos: Vec<String>,
    opts: HashMap<String, Option<String>>,
}

/// A usage error with its message.
#[derive(Debug)]
pub struct Usage(pub String);

impl Args {
    /// Parses `raw`; `valued` lists the options that take a value.
    pub fn parse(raw: &[String], valued: &[&str], flags: &[&str]) -> Result<Args, Usage> {
        let mut pos = Vec::new();
        let mut opts = HashMap::new();
        let mut it = raw.iter();
        while let Some(a) = it.next() {
            if let Some(name) = a.strip_prefix("--") {
                let (k, inline) = match name.split_once('=') {
                    Some((k, v)) => (k, Some(v.to_string())),
                    None => (name, None),
                };
                if valued.contains(&k) {
                    let v = match inline {
                        Some(v) => v,
                        None => it.next().ok_or_else(|| Usage(format!("--{k} needs a value")))?.clone(),
                    };
                    opts.insert(k.to_string(), Some(v));
                } else if flags.contains(&k) && inline.is_none() {
                    opts.insert(k.to_string(), None);
                } else {
                    return Err(Usage(format!("unknown option --{k}")));
                }
            } else {
                pos.push(a.clone());
            }
        }
        Ok(Args { pos, opts })
    }

    /// True if `--name` was given.
    pub fn flag(&self, name: &str) -> bool {
        self.opts.contains_key(name)
    }

    /// The value of `--name`, if given.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.opts.get(name).and_then(|v| v.as_deref())
    }

    /// `--name` parsed as `T`, or `default`.
    pub fn num<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, Usage> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| Usage(format!("--{name}: not a number: {v}"))),
        }
    }

    /// `--name` parsed as a size with units, or `default`.
    pub fn size(&self, name: &str, default: u64) -> Result<u64, Usage> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => cxlkv_platform::size::parse_size(v).map_err(|_| Usage(format!("--{name}: not a size: {v}"))),
        }
    }

    /// The single positional PATH.
    pub fn path(&self) -> Result<&str, Usage> {
        match self.pos.as_slice() {
            [p] => Ok(p),
            [] => Err(Usage("missing PATH".into())),
            _ => Err(Usage("expected one PATH".into())),
        }
    }
}
