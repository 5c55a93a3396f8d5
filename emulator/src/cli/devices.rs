//! `softverbs devices`: the device list, as `ibv_devices` prints it, plus
//! the backend of each device.
//!
//! ```text
//!     device                 node GUID    backend
//!     ------              ----------------        -------
//!     softverbs_0         025376007f535601        soft
//! ```

use std::io::Write;

use softverbs::verbs::Device;

use super::{CliError, Env};

/// Arguments of `softverbs devices`.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(args_override_self = true)]
pub struct Args {}

/// Lists the devices of the selected backend(s).
///
/// # Errors
///
/// [`CliError::NotFound`] when there is no device.
pub fn run(env: &Env, _args: &Args, out: &mut dyn Write) -> Result<(), CliError> {
    let devs = env.devices(env.global.listing_backend())?;
    out.write_all(render(&devs).as_bytes())?;
    Ok(())
}

/// The table for `devs`.
pub fn render(devs: &[Device]) -> String {
    let mut s = format!("    {:<16}\t   node GUID\tbackend\n", "device");
    s.push_str(&format!("    {:<16}\t----------------\t-------\n", "------"));
    for d in devs {
        s.push_str(&format!("    {:<16}\t{:016x}\t{}\n", d.name(), d.guid().0, d.backend()));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_matches_ibv_devices() {
        let s = render(&[]);
        let mut lines = s.lines();
        assert_eq!(lines.next(), Some("    device          \t   node GUID\tbackend"));
        assert_eq!(lines.next(), Some("    ------          \t----------------\t-------"));
        assert_eq!(lines.next(), None);
    }
}
