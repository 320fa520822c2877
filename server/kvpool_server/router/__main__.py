from kvpool_server.router.cli import main

main()
