DROP TABLE hub_secret;
