//! Adversarial and consistency tests of the state machines, message by message: forged,
//! swapped and replayed shares, the server's refusals, and the clients' privacy checks.

mod common;

use common::UpToRound2;
use fedshard_secagg::crypto;
use fedshard_secagg::message::{ClientBody, EncryptedShare, Header, PublicKeys, ServerBody};
use fedshard_secagg::{
    Client, ClientId, ClientMessage, Error, Graph, Params, Round, Server, ServerMessage, SessionId,
};

fn params(session: u8, n: u32, threshold: usize) -> Params {
    Params {
        session: SessionId([session; 16]),
        clients: (0..n).collect(),
        threshold,
        graph: Graph::Complete,
        bits: 16,
        vector_len: 4,
    }
}

/// Client `id`'s secrets come from the seed `[id + 1; 32]`, the same in every session.
fn up_to_round_2(params: &Params) -> UpToRound2 {
    common::up_to_round_2(params, |id| [id as u8 + 1; 32])
}

fn shares_of(message: &ServerMessage) -> Vec<EncryptedShare> {
    match &message.body {
        ServerBody::Shares(shares) => shares.clone(),
        other => panic!("expected shares, got {other:?}"),
    }
}

fn with_shares(message: &ServerMessage, shares: Vec<EncryptedShare>) -> ServerMessage {
    ServerMessage {
        body: ServerBody::Shares(shares),
        ..message.clone()
    }
}

#[test]
fn a_flipped_ciphertext_byte_is_refused() {
    let mut s = up_to_round_2(&params(1, 3, 2));
    let mut shares = shares_of(&s.inboxes[0].1);
    shares[0].ciphertext[10] ^= 0x01;
    let forged = with_shares(&s.inboxes[0].1, shares);
    let result = s.clients[0].masked_input(&forged, &[0; 4]);
    assert_eq!(result, Err(Error::ShareRejected { from: 1, to: 0 }));
    assert!(
        s.clients[0].aborted(),
        "a client that saw a forged share leaves the session"
    );
}

#[test]
fn a_share_relabelled_to_another_sender_is_refused() {
    // Client 0 gets the share 1 made for it, but labelled as coming from 2: the key and the
    // associated data name the pair (1, 0), so it cannot open as (2, 0).
    let mut s = up_to_round_2(&params(2, 3, 2));
    let shares = shares_of(&s.inboxes[0].1);
    let from_1 = shares.iter().find(|e| e.peer == 1).unwrap().clone();
    let swapped = vec![from_1.clone(), EncryptedShare { peer: 2, ..from_1 }];
    let forged = with_shares(&s.inboxes[0].1, swapped);
    let result = s.clients[0].masked_input(&forged, &[0; 4]);
    assert_eq!(result, Err(Error::ShareRejected { from: 2, to: 0 }));
}

#[test]
fn a_share_meant_for_another_receiver_is_refused() {
    // The share 1 made for 2, delivered to 0 as if from 1.
    let mut s = up_to_round_2(&params(3, 3, 2));
    let for_2 = shares_of(&s.inboxes[2].1)
        .into_iter()
        .find(|e| e.peer == 1)
        .unwrap();
    let mut shares = shares_of(&s.inboxes[0].1);
    let slot = shares.iter().position(|e| e.peer == 1).unwrap();
    shares[slot] = for_2;
    let forged = with_shares(&s.inboxes[0].1, shares);
    let result = s.clients[0].masked_input(&forged, &[0; 4]);
    assert_eq!(result, Err(Error::ShareRejected { from: 1, to: 0 }));
}

#[test]
fn a_share_replayed_from_another_session_is_refused() {
    // Same clients, same secrets (same seeds), another session id: the derived key and the
    // associated data both change, so yesterday's ciphertexts do not open today.
    let mut today = up_to_round_2(&params(4, 3, 2));
    let yesterday = up_to_round_2(&params(5, 3, 2));
    let replayed = with_shares(&today.inboxes[0].1, shares_of(&yesterday.inboxes[0].1));
    let result = today.clients[0].masked_input(&replayed, &[0; 4]);
    assert!(
        matches!(result, Err(Error::ShareRejected { to: 0, .. })),
        "{result:?}"
    );
}

#[test]
fn the_associated_data_binds_session_round_sender_and_receiver() {
    let session = SessionId([6; 16]);
    let key = [9u8; 32];
    let nonce = [1u8; 12];
    let plain = [7u8; crypto::PLAINTEXT_LEN];
    let ad = crypto::associated_data(session, Round::ShareKeys, 1, 2);
    let sealed = crypto::seal(&key, &nonce, &plain, &ad);
    assert_eq!(
        crypto::open(&key, &nonce, &sealed, &ad, 1, 2).as_deref(),
        Ok(&plain[..])
    );
    for other in [
        crypto::associated_data(SessionId([7; 16]), Round::ShareKeys, 1, 2),
        crypto::associated_data(session, Round::MaskedInput, 1, 2),
        crypto::associated_data(session, Round::ShareKeys, 2, 1),
        crypto::associated_data(session, Round::ShareKeys, 1, 3),
    ] {
        assert_eq!(
            crypto::open(&key, &nonce, &sealed, &other, 1, 2),
            Err(Error::ShareRejected { from: 1, to: 2 })
        );
    }
}

/// Drives a session with no dropouts up to round 3's request.
fn up_to_round_3(params: &Params) -> (UpToRound2, ServerMessage) {
    let mut s = up_to_round_2(params);
    for (to, message) in s.inboxes.clone() {
        let client = &mut s.clients[to as usize];
        s.server
            .receive(client.masked_input(&message, &[to as u64; 4]).unwrap())
            .unwrap();
    }
    let request = s.server.close_masked_input().unwrap();
    (s, request)
}

fn unmask_request(
    params: &Params,
    survivors: Vec<ClientId>,
    dropped: Vec<ClientId>,
) -> ServerMessage {
    ServerMessage {
        session: params.session,
        round: Round::Unmask,
        body: ServerBody::UnmaskRequest { survivors, dropped },
    }
}

#[test]
fn a_client_refuses_to_reveal_both_secrets_of_one_client() {
    let p = params(8, 4, 3);
    let (mut s, _) = up_to_round_3(&p);
    // Client 3 named both a survivor (reveal b_3) and dropped (reveal s_3): that reveals x_3.
    let greedy = unmask_request(&p, vec![0, 1, 2, 3], vec![3]);
    assert_eq!(s.clients[0].unmask(&greedy), Err(Error::BothRequested(3)));
    // And having refused, the client answers no second request either.
    let honest = unmask_request(&p, vec![0, 1, 2, 3], vec![]);
    assert!(matches!(
        s.clients[0].unmask(&honest),
        Err(Error::OutOfOrder { .. })
    ));
}

#[test]
fn a_client_answers_one_unmask_request_only() {
    // Asking first for b_3 (3 survived) and then for s_3 (3 dropped) would reveal x_3 too.
    let p = params(9, 4, 3);
    let (mut s, request) = up_to_round_3(&p);
    assert!(s.clients[0].unmask(&request).is_ok());
    let second = unmask_request(&p, vec![0, 1, 2], vec![3]);
    assert!(matches!(
        s.clients[0].unmask(&second),
        Err(Error::OutOfOrder { .. })
    ));
}

#[test]
fn a_client_named_dropped_or_shown_too_few_survivors_aborts() {
    let p = params(10, 4, 3);
    let (mut s, _) = up_to_round_3(&p);
    let named = unmask_request(&p, vec![1, 2, 3], vec![0]);
    assert_eq!(s.clients[0].unmask(&named), Err(Error::NamedDropped(0)));
    let few = unmask_request(&p, vec![0, 1], vec![2, 3]);
    assert!(matches!(
        s.clients[1].unmask(&few),
        Err(Error::TooFewClients {
            round: Round::Unmask,
            needed: 3,
            got: 2
        })
    ));
    let silent = unmask_request(&p, vec![0, 1, 2], vec![]);
    assert_eq!(s.clients[2].unmask(&silent), Err(Error::Unaccounted(3)));
}

#[test]
fn the_server_refuses_duplicates_strangers_and_wrong_rounds() {
    let p = params(11, 3, 2);
    let mut server = Server::new(p.clone()).unwrap();
    let mut client = Client::new(p.clone(), 0, [1; 32]).unwrap();
    let advert = client.advertise_keys().unwrap();
    server.receive(advert.clone()).unwrap();
    assert_eq!(
        server.receive(advert.clone()),
        Err(Error::Duplicate {
            client: 0,
            round: Round::AdvertiseKeys
        })
    );
    let stranger = ClientMessage {
        header: Header {
            sender: 7,
            ..advert.header
        },
        body: advert.body.clone(),
    };
    assert_eq!(server.receive(stranger), Err(Error::UnknownClient(7)));
    let other_session = ClientMessage {
        header: Header {
            session: SessionId([12; 16]),
            sender: 1,
            ..advert.header
        },
        body: advert.body.clone(),
    };
    assert!(matches!(
        server.receive(other_session),
        Err(Error::WrongSession { .. })
    ));
    let early = ClientMessage {
        header: Header {
            round: Round::MaskedInput,
            sender: 1,
            ..advert.header
        },
        body: ClientBody::MaskedInput(vec![0; 4]),
    };
    assert_eq!(
        server.receive(early),
        Err(Error::WrongRound {
            expected: Round::AdvertiseKeys,
            got: Round::MaskedInput
        })
    );
    // A header that says round 0 over a round-2 body is a wrong round too.
    let mislabelled = ClientMessage {
        header: Header {
            sender: 1,
            ..advert.header
        },
        body: ClientBody::MaskedInput(vec![0; 4]),
    };
    assert!(matches!(
        server.receive(mislabelled),
        Err(Error::WrongRound { .. })
    ));
}

#[test]
fn the_server_refuses_late_messages_and_clients_that_skipped_a_round() {
    let p = params(13, 3, 2);
    let mut s = up_to_round_2(&p);
    // A second ShareKeys after round 1 closed is a wrong round.
    let mut late_client = Client::new(p.clone(), 0, [1; 32]).unwrap();
    late_client.advertise_keys().unwrap();
    let directory = ServerMessage {
        session: p.session,
        round: Round::ShareKeys,
        body: ServerBody::KeyDirectory(vec![]),
    };
    assert!(
        late_client.share_keys(&directory).is_err(),
        "an empty directory misses the client"
    );
    let late = ClientMessage {
        header: Header {
            session: p.session,
            round: Round::ShareKeys,
            sender: 0,
        },
        body: ClientBody::ShareKeys {
            commitment: [0; 32],
            shares: vec![],
        },
    };
    assert_eq!(
        s.server.receive(late),
        Err(Error::WrongRound {
            expected: Round::MaskedInput,
            got: Round::ShareKeys
        })
    );
    // A masked input of the wrong length is malformed and leaves the round open.
    let short = ClientMessage {
        header: Header {
            session: p.session,
            round: Round::MaskedInput,
            sender: 1,
        },
        body: ClientBody::MaskedInput(vec![0; 3]),
    };
    assert!(matches!(
        s.server.receive(short),
        Err(Error::Malformed { client: 1, .. })
    ));
    let (to, message) = s.inboxes[1].clone();
    let honest = s.clients[to as usize]
        .masked_input(&message, &[1; 4])
        .unwrap();
    assert_eq!(s.server.receive(honest), Ok(()));
}

#[test]
fn a_directory_that_replaces_a_clients_key_is_refused() {
    type Directory = Vec<(ClientId, PublicKeys)>;
    let p = params(14, 3, 2);
    let mut server = Server::new(p.clone()).unwrap();
    let mut clients: Vec<Client> = (0..3)
        .map(|id| Client::new(p.clone(), id, [id as u8 + 1; 32]).unwrap())
        .collect();
    for client in &mut clients {
        server.receive(client.advertise_keys().unwrap()).unwrap();
    }
    // On the complete graph every client's directory holds all three clients.
    let directory = server.close_advertise_keys().unwrap().remove(0).1;
    let ServerBody::KeyDirectory(entries) = &directory.body else {
        unreachable!()
    };
    let tampered = |change: &dyn Fn(&mut Directory)| {
        let mut entries = entries.clone();
        change(&mut entries);
        ServerMessage {
            body: ServerBody::KeyDirectory(entries),
            ..directory.clone()
        }
    };
    let replaced = tampered(&|e| e[0].1.mask = [5; 32]);
    assert_eq!(
        clients[0].share_keys(&replaced),
        Err(Error::DirectoryMismatch(0))
    );
    let repeated = tampered(&|e| e[2].1 = e[1].1);
    assert_eq!(
        clients[1].share_keys(&repeated),
        Err(Error::RepeatedKey(1, 2))
    );
}

#[test]
fn unmasking_by_hand_gives_the_sum_and_out_of_order_calls_are_refused() {
    let p = params(15, 4, 3);
    let mut s = up_to_round_2(&p);
    assert!(matches!(s.server.finish(), Err(Error::OutOfOrder { .. })));
    assert!(matches!(
        s.server.close_share_keys(),
        Err(Error::OutOfOrder { .. })
    ));
    let (mut s, request) = up_to_round_3(&p);
    for client in &mut s.clients {
        s.server.receive(client.unmask(&request).unwrap()).unwrap();
    }
    // Inputs are [id; 4]: 0 + 1 + 2 + 3.
    assert_eq!(s.server.finish().unwrap().sum, vec![6; 4]);
}

#[test]
fn the_server_refuses_an_unmask_reply_that_reveals_a_survivors_key() {
    let p = params(16, 4, 3);
    let (mut s, request) = up_to_round_3(&p);
    let mut reply = s.clients[0].unmask(&request).unwrap();
    let ClientBody::Unmask(shares) = &mut reply.body else {
        unreachable!()
    };
    let survivor_share = shares.self_mask[1];
    shares.mask_key.push(survivor_share);
    assert!(matches!(
        s.server.receive(reply),
        Err(Error::Malformed { client: 0, .. })
    ));
}

#[test]
fn a_wrong_self_mask_share_is_caught_by_the_commitment() {
    // Holder 1 alters its share of b_0; the server rebuilds b_0 from holders 0, 1 and 2 (the
    // first t in id order), and the result does not match 0's commitment: an error, not a wrong
    // sum.
    let p = params(17, 4, 3);
    let (mut s, request) = up_to_round_3(&p);
    for client in &mut s.clients {
        let mut reply = client.unmask(&request).unwrap();
        if client.id() == 1 {
            let ClientBody::Unmask(shares) = &mut reply.body else {
                unreachable!()
            };
            assert_eq!(shares.self_mask[0].0, 0);
            shares.self_mask[0].1.values[0] ^= 1;
        }
        s.server.receive(reply).unwrap();
    }
    assert_eq!(
        s.server.finish().map(|a| a.sum),
        Err(Error::InconsistentShares(0))
    );
}
