//! `cursorlog cluster init|status|add-learner|promote|remove`: operate a replicated cluster
//! through its members' `cursorlog.raft.v1.ClusterAdmin` service; `cluster force-new` works
//! on a stopped member's data directory (a lost quorum's way out).
//!
//! Every command takes `--members` (the cluster's client addresses, comma-separated); a
//! membership change goes to whichever of them reports itself leader.

use std::process::ExitCode;
use std::time::Duration;

use cursorlog_proto::raft_v1::cluster_admin_client::ClusterAdminClient;
use cursorlog_proto::raft_v1::{
    AddLearnerRequest, InitRequest, MemberStatus, MembersRequest, StatusRequest,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// What to do with the cluster.
#[derive(Debug, clap::Subcommand)]
pub enum ClusterCommand {
    /// Form the cluster from the --peers list of the members (started with `serve --join`),
    /// then wait for its first leader. Refused when the cluster is already formed.
    Init(Target),
    /// Print each member's view: role, term, leader, log, commit and apply indexes, lag.
    Status(Target),
    /// Add a member as a learner (it copies the log, does not vote) and wait until it caught
    /// up. Start it first with `serve --node-id ID --peers …` listing the current members and
    /// itself.
    AddLearner {
        #[command(flatten)]
        target: Target,
        /// The new member's id.
        #[arg(long)]
        id: u64,
        /// The new member's --listen address, HOST:PORT.
        #[arg(long)]
        addr: String,
    },
    /// Make learners voters.
    Promote {
        #[command(flatten)]
        target: Target,
        /// The learners' ids.
        #[arg(long = "id", required = true)]
        ids: Vec<u64>,
    },
    /// Remove members (voters or learners) from the cluster.
    Remove {
        #[command(flatten)]
        target: Target,
        /// The members' ids.
        #[arg(long = "id", required = true)]
        ids: Vec<u64>,
    },
    /// LOST QUORUM ONLY: make this stopped member the only voter of its cluster (in the
    /// spirit of etcd's --force-new-cluster). Run it on the surviving member with the longest
    /// log, while it is stopped; it prints the log entries it cannot vouch for. Then start it
    /// with its usual flags and add the others back (`add-learner`, `promote`) on empty
    /// directories. README, "Recovery".
    ForceNew {
        /// The stopped member's data directory.
        #[arg(long)]
        data_dir: std::path::PathBuf,
        /// The member's id (its --node-id).
        #[arg(long)]
        node_id: u64,
        /// Its --listen address, HOST:PORT [default: its address in the last membership
        /// its log holds].
        #[arg(long)]
        addr: Option<String>,
    },
}

/// How to reach the cluster.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// The members' client addresses, HOST:PORT, comma-separated.
    #[arg(
        long,
        env = "CURSORLOG_MEMBERS",
        value_delimiter = ',',
        required = true
    )]
    pub members: Vec<String>,
    /// The bearer token, if the cluster requires one.
    #[arg(long, env = "CURSORLOG_AUTH_TOKEN", hide_env_values = true)]
    pub auth_token: Option<String>,
    /// Connect over TLS, trusting this CA certificate (PEM).
    #[arg(long, env = "CURSORLOG_CA")]
    pub ca: Option<std::path::PathBuf>,
}

type Client = ClusterAdminClient<tonic::service::interceptor::InterceptedService<Channel, Auth>>;

/// Adds the bearer token to every call.
#[derive(Clone)]
pub struct Auth(Option<tonic::metadata::AsciiMetadataValue>);

impl tonic::service::Interceptor for Auth {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

async fn client(target: &Target, addr: &str) -> Result<Client, String> {
    let scheme = if target.ca.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
        .map_err(|e| format!("bad member address {addr:?}: {e}"))?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(120));
    if let Some(ca) = &target.ca {
        let pem =
            std::fs::read(ca).map_err(|e| format!("cannot read --ca {}: {e}", ca.display()))?;
        endpoint = endpoint
            .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))
            .map_err(|e| format!("TLS: {e}"))?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let auth = match &target.auth_token {
        Some(t) => Some(
            format!("Bearer {}", t.trim())
                .parse()
                .map_err(|_| "the auth token is not visible ASCII".to_owned())?,
        ),
        None => None,
    };
    Ok(ClusterAdminClient::with_interceptor(channel, Auth(auth)))
}

/// Runs a `cluster` command; exit status 1 on failure.
pub fn run(command: ClusterCommand) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cursorlog: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(execute(command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cursorlog: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn execute(command: ClusterCommand) -> Result<(), String> {
    match command {
        ClusterCommand::ForceNew {
            data_dir,
            node_id,
            addr,
        } => {
            let report = tokio::task::spawn_blocking(move || {
                cursorlog_replication::recovery::force_new_cluster(&data_dir, node_id, addr)
            })
            .await
            .map_err(|e| e.to_string())??;
            print!("{report}");
            Ok(())
        }
        ClusterCommand::Init(target) => init(&target).await,
        ClusterCommand::Status(target) => {
            println!("{}", header());
            let mut reached = 0;
            for addr in &target.members {
                match status_of(&target, addr).await {
                    Ok(s) => {
                        reached += 1;
                        println!("{}", row(addr, &s));
                    }
                    Err(e) => println!("{addr:<22} unreachable: {e}"),
                }
            }
            if reached == 0 {
                return Err("no member answered".into());
            }
            Ok(())
        }
        ClusterCommand::AddLearner { target, id, addr } => {
            let mut leader = leader(&target).await?;
            let s = leader
                .add_learner(AddLearnerRequest { node_id: id, addr })
                .await
                .map_err(|e| e.message().to_owned())?
                .into_inner();
            println!(
                "member {id} added as a learner and caught up; members now:\n{}",
                members(&s)
            );
            Ok(())
        }
        ClusterCommand::Promote { target, ids } => {
            let mut leader = leader(&target).await?;
            let s = leader
                .promote(MembersRequest { node_ids: ids })
                .await
                .map_err(|e| e.message().to_owned())?
                .into_inner();
            println!("promoted; members now:\n{}", members(&s));
            Ok(())
        }
        ClusterCommand::Remove { target, ids } => {
            let mut leader = leader(&target).await?;
            let s = leader
                .remove(MembersRequest { node_ids: ids })
                .await
                .map_err(|e| e.message().to_owned())?
                .into_inner();
            println!("removed; members now:\n{}", members(&s));
            Ok(())
        }
    }
}

/// `cluster init`: asks the first member that answers to form the cluster, then waits for
/// a leader.
async fn init(target: &Target) -> Result<(), String> {
    let mut last = String::new();
    let mut formed = None;
    for addr in &target.members {
        let mut c = match client(target, addr).await {
            Ok(c) => c,
            Err(e) => {
                last = e;
                continue;
            }
        };
        match c.init(InitRequest {}).await {
            Ok(s) => {
                formed = Some(s.into_inner());
                break;
            }
            Err(e) if e.code() == tonic::Code::FailedPrecondition => {
                return Err(format!("{addr}: {}", e.message()));
            }
            Err(e) => last = format!("{addr}: {}", e.message()),
        }
    }
    let Some(s) = formed else {
        return Err(format!("no member formed the cluster (last: {last})"));
    };
    println!("formed the cluster; members:\n{}", members(&s));
    println!("waiting for the first leader…");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        for addr in &target.members {
            if let Ok(s) = status_of(target, addr).await {
                if s.role == "leader" {
                    println!("member {} at {addr} leads (term {})", s.node_id, s.term);
                    return Ok(());
                }
                if s.leader_id != 0 && !s.leader_addr.is_empty() {
                    let (id, at) = (s.leader_id, &s.leader_addr);
                    println!("member {id} at {at} leads (term {})", s.term);
                    return Ok(());
                }
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(
                "no leader within 60 s of forming the cluster: are a majority of the members \
                 running? (`cursorlog cluster status` shows each member's view)"
                    .into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn status_of(target: &Target, addr: &str) -> Result<MemberStatus, String> {
    let mut c = client(target, addr).await?;
    c.status(StatusRequest {})
        .await
        .map(tonic::Response::into_inner)
        .map_err(|e| e.message().to_owned())
}

/// The member that reports itself leader.
async fn leader(target: &Target) -> Result<Client, String> {
    for addr in &target.members {
        if let Ok(s) = status_of(target, addr).await {
            if s.role == "leader" {
                return client(target, addr).await;
            }
            if !s.leader_addr.is_empty() {
                if let Ok(l) = status_of(target, &s.leader_addr).await {
                    if l.role == "leader" {
                        return client(target, &s.leader_addr).await;
                    }
                }
            }
        }
    }
    Err(format!(
        "no leader among {}: an election may be under way; retry in a few seconds (`cursorlog cluster status` shows each member's view)",
        target.members.join(", ")
    ))
}

fn header() -> String {
    format!(
        "{:<22} {:>4} {:<9} {:>5} {:>6} {:>9} {:>9} {:>9}  lag",
        "member", "id", "role", "term", "leader", "last_log", "committed", "applied"
    )
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

fn row(addr: &str, s: &MemberStatus) -> String {
    let lag = s
        .lag
        .iter()
        .map(|(id, n)| format!("{id}:{n}"))
        .collect::<Vec<_>>()
        .join(" ");
    format!(
        "{addr:<22} {:>4} {:<9} {:>5} {:>6} {:>9} {:>9} {:>9}  {lag}",
        s.node_id,
        s.role,
        s.term,
        if s.leader_id == 0 {
            "-".into()
        } else {
            s.leader_id.to_string()
        },
        opt(s.last_log_index),
        opt(s.committed_index),
        opt(s.applied_index),
    )
}

fn members(s: &MemberStatus) -> String {
    let mut voters: Vec<_> = s.voters.iter().collect();
    voters.sort();
    let mut learners: Vec<_> = s.learners.iter().collect();
    learners.sort();
    let list = |v: &[(&u64, &String)]| {
        v.iter()
            .map(|(id, a)| format!("{id}={a}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    format!(
        "  voters:   {}\n  learners: {}",
        list(&voters),
        list(&learners)
    )
}
