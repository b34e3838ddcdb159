//! Drives a session's state machines by hand, for tests that tamper with single messages.

use fedshard_secagg::{Client, ClientId, Params, Server, ServerMessage};

/// A session driven up to the opening of round 2: the server, its clients (client `id`'s
/// secrets drawn from `seed(id)`), and each client's inbox of forwarded shares.
pub struct UpToRound2 {
    pub server: Server,
    pub clients: Vec<Client>,
    pub inboxes: Vec<(ClientId, ServerMessage)>,
}

pub fn up_to_round_2(params: &Params, seed: impl Fn(ClientId) -> [u8; 32]) -> UpToRound2 {
    let mut server = Server::new(params.clone()).unwrap();
    let mut clients: Vec<Client> = params
        .clients
        .iter()
        .map(|&id| Client::new(params.clone(), id, seed(id)).unwrap())
        .collect();
    for client in &mut clients {
        server.receive(client.advertise_keys().unwrap()).unwrap();
    }
    for (to, directory) in server.close_advertise_keys().unwrap() {
        let client = &mut clients[params.clients.binary_search(&to).unwrap()];
        server
            .receive(client.share_keys(&directory).unwrap())
            .unwrap();
    }
    let inboxes = server.close_share_keys().unwrap();
    UpToRound2 {
        server,
        clients,
        inboxes,
    }
}
