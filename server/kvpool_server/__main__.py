from kvpool_server.cli import main

main()
